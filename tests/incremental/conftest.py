"""Where the incremental checkpoint tests save: local disk and each object-store emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage_servers import create_bucket
from tests.stores import Store

_SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "abfs"}


def store_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh place of ``kind`` ("local" or a store with a ``{kind}_server`` fixture) to save to."""
    if kind == "local":
        return Store("local", str(tmp_path / "store"))
    server = request.getfixturevalue(f"{kind}_server")
    bucket = create_bucket(server, "incr")
    return Store(kind, f"{_SCHEMES[kind]}://{bucket}/runs", server.storage_options)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs on local disk and on S3 (moto)."""
    return store_of(str(request.param), request, tmp_path)


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """For the round trip: local disk, S3 (moto), GCS (fake-gcs-server) and Azure (Azurite)."""
    return store_of(str(request.param), request, tmp_path)
