"""A ``remote`` fixture that runs each test once per object store, against real emulators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.storage_servers import StorageServer, create_bucket

BACKENDS = ("s3", "gcs", "azure")
_SCHEME = {"s3": "s3", "gcs": "gs", "azure": "abfs"}
_FIXTURE = {"s3": "s3_server", "gcs": "gcs_server", "azure": "azure_server"}


@dataclass(frozen=True)
class Remote:
    """A fresh bucket on one emulator: URIs in it and the options to reach it."""

    backend: str
    scheme: str
    bucket: str
    server: StorageServer
    storage_options: dict[str, Any] = field(default_factory=dict)

    def uri(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"


def remote_for(backend: str, server: StorageServer) -> Remote:
    return Remote(
        backend=backend,
        scheme=_SCHEME[backend],
        bucket=create_bucket(server, "cp"),
        server=server,
        storage_options=server.storage_options,
    )


@pytest.fixture(params=BACKENDS)
def remote(request: pytest.FixtureRequest) -> Remote:
    """Each test using it runs on S3 (moto), GCS (fake-gcs-server) and Azure (Azurite)."""
    backend = str(request.param)
    return remote_for(backend, request.getfixturevalue(_FIXTURE[backend]))
