"""Fixtures for the DCP tests: where checkpoints go (local disk or a real object-store emulator),
and a guard that the environment of the test process names no launcher."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage_servers import StorageServer, create_bucket
from tests.stores import Store, clear_launcher_variables


@pytest.fixture(autouse=True)
def outside_any_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process itself is no rank: it loads with ``no_dist`` where it checks a result."""
    clear_launcher_variables(monkeypatch)


def _remote(server: StorageServer, prefix: str) -> Store:
    bucket = create_bucket(server, prefix)
    return Store(server.backend, f"{server.protocol}://{bucket}/checkpoints", server.storage_options)


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return Store("local", str(tmp_path / "checkpoints"))


@pytest.fixture
def s3_store(s3_server: StorageServer) -> Store:
    return _remote(s3_server, "dcp")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs once on local disk and once on S3 (moto)."""
    if request.param == "local":
        return Store("local", str(tmp_path / "checkpoints"))
    return _remote(request.getfixturevalue("s3_server"), "dcp")


@pytest.fixture
def gcs_store(gcs_server: StorageServer) -> Store:
    return _remote(gcs_server, "dcp")


@pytest.fixture
def azure_store(azure_server: StorageServer) -> Store:
    return _remote(azure_server, "dcp")
