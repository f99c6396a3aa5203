"""What the multi-part and distributed checkpoint tests share: where a test keeps its checkpoints,
and a test process that is no launcher's rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.storage_servers import create_bucket

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Store:
    """Where a test keeps its checkpoints: a base URI and the options to reach it."""

    kind: str
    base: str
    storage_options: dict[str, Any] | None = field(default=None)

    def uri(self, name: str) -> str:
        return f"{self.base}/{name}"


STORE_KINDS = ("local", "s3", "gcs", "azure")
"""Every place a checkpoint can live: local disk and each object-store emulator."""

_SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "abfs"}


def store_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path, prefix: str = "cp") -> Store:
    """A fresh place of ``kind`` (one of :data:`STORE_KINDS`) to save to: a directory under
    ``tmp_path``, or a new bucket on the session's ``{kind}_server`` emulator."""
    if kind == "local":
        return Store("local", str(tmp_path / "store"))
    server = request.getfixturevalue(f"{kind}_server")
    bucket = create_bucket(server, prefix)
    return Store(kind, f"{_SCHEMES[kind]}://{bucket}/runs", server.storage_options)


def clear_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset what torchrun sets, whatever the shell running the tests has: the test process is
    rank 0 of 1, not one of a launcher's ranks."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
