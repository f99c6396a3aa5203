"""Every test starts and ends with no preemption notice in this process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flyte_checkpoint.preemption import notice


@pytest.fixture(autouse=True)
def no_preemption_notice() -> Iterator[None]:
    notice.clear()
    yield
    notice.clear()
