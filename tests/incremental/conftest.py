"""Where the incremental checkpoint tests save: local disk and S3 (``any_store``, every store, is
shared from ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stores import Store, store_of


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs on local disk and on S3 (moto)."""
    return store_of(str(request.param), request, tmp_path, "incr")
