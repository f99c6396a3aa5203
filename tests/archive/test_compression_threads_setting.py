"""A compression-threads setting that is not a number is refused quoting what was set."""

from __future__ import annotations

import pytest

from flyte_checkpoint import ConfigurationError
from flyte_checkpoint.archive.compression import THREADS_ENV, compression_threads


def test_a_setting_that_is_not_a_number_is_quoted_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ConfigurationError, match=f"{THREADS_ENV} must be a whole number") as raised:
        compression_threads()
    assert "got 'two'" in str(raised.value)
    assert "got 0" not in str(raised.value)
