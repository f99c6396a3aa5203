"""What the multi-part and distributed checkpoint tests share: where a test keeps its checkpoints,
and a test process that is no launcher's rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Store:
    """Where a test keeps its checkpoints: a base URI and the options to reach it."""

    kind: str
    base: str
    storage_options: dict[str, Any] | None = field(default=None)

    def uri(self, name: str) -> str:
        return f"{self.base}/{name}"


def clear_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset what torchrun sets, whatever the shell running the tests has: the test process is
    rank 0 of 1, not one of a launcher's ranks."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
