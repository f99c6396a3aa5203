"""Fault injection for saves: uploads that stall or fail, files that cannot be opened when packed."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointStorageError
from flyte_checkpoint.archive import tar_writer
from flyte_checkpoint.storage.base import Backend


def restore(target: Path) -> Path:
    restored = Checkpoint("unused", str(target)).load_sync()
    assert restored is not None
    return restored


def stall_uploads(monkeypatch: pytest.MonkeyPatch, backend: Backend, gate: threading.Event) -> list[str]:
    """Fault injection: every upload waits for ``gate`` before it starts writing."""
    original = backend.open_write
    started: list[str] = []

    def gated_open_write(uri: str, metadata: Any, **declared: Any) -> Any:
        started.append(uri)
        assert gate.wait(30), "test gate never opened"
        return original(uri, metadata, **declared)

    monkeypatch.setattr(backend, "open_write", gated_open_write)
    return started


def stalled_checkpoint(target: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Checkpoint, threading.Event]:
    """A helper saving to ``target`` whose uploads wait until the returned gate is set."""
    cp = Checkpoint(str(target))
    gate = threading.Event()
    stall_uploads(monkeypatch, cp._dest_backend, gate)
    return cp, gate


def failing_uploads(monkeypatch: pytest.MonkeyPatch, cp: Checkpoint) -> None:
    def upload_fails(uri: str, metadata: Any, **declared: Any) -> Any:
        raise CheckpointStorageError("injected upload failure")

    monkeypatch.setattr(cp._dest_backend, "open_write", upload_fails)


def fail_to_open(monkeypatch: pytest.MonkeyPatch, name: str, error: int) -> None:
    """Fault injection (root reads every file): opening ``name`` to pack it fails with ``error``."""

    def failing(path: str) -> None:
        raise OSError(error, os.strerror(error), path)

    before_packing(monkeypatch, name, failing)


def before_packing(monkeypatch: pytest.MonkeyPatch, name: str, action: Callable[[str], None]) -> None:
    """Fault injection: ``action(path)`` runs just before the archive writer opens ``name``."""
    real_open = os.open

    def hooked_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(path) == name and not flags & (os.O_WRONLY | os.O_RDWR):
            action(os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(tar_writer, "os", SimpleNamespace(**{**vars(os), "open": hooked_open}))
