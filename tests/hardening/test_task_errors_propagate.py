"""A task's own exception leaves the runner as itself when closing its helper also fails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import CheckpointStorageError, current_checkpoint, run_with_retries
from flyte_checkpoint.storage.stores.local import LocalBackend


def test_the_tasks_error_propagates_with_the_failed_background_save_attached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def upload_fails(self: LocalBackend, uri: str, metadata: Any, **declared: Any) -> Any:
        raise CheckpointStorageError("injected upload failure")

    monkeypatch.setattr(LocalBackend, "open_write", upload_fails)

    def task() -> None:
        current_checkpoint().save_sync(b"state", background=True)
        raise KeyError("the task's own error")

    with pytest.raises(KeyError, match="the task's own error") as raised:
        run_with_retries(task, retries=0, checkpoint_dir=tmp_path)
    assert any("injected upload failure" in note for note in getattr(raised.value, "__notes__", []))
