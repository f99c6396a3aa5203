"""Typed code reaches the running task's helper in one call, and saves what the runtime accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointPaths,
    NoTaskCheckpointError,
    TaskContext,
    current_checkpoint,
    run_with_retries,
    task_context,
)


def test_current_checkpoint_is_the_tasks_helper(tmp_path: Path) -> None:
    def task() -> bool:
        helper = current_checkpoint()
        return isinstance(helper, Checkpoint) and helper is current_checkpoint()

    assert run_with_retries(task, retries=0, checkpoint_dir=tmp_path)


def test_current_checkpoint_outside_a_task_says_how_to_run_one() -> None:
    with pytest.raises(NoTaskCheckpointError, match="no task is running"):
        current_checkpoint()


def test_current_checkpoint_in_a_task_without_a_location_says_what_is_missing() -> None:
    with (
        task_context(TaskContext(checkpoint_paths=CheckpointPaths())),
        pytest.raises(NoTaskCheckpointError, match="checkpoint_path"),
    ):
        current_checkpoint()


@pytest.mark.parametrize("data", [bytearray(b"state"), memoryview(b"state")], ids=["bytearray", "memoryview"])
def test_bytes_like_data_saves_as_bytes(data: bytearray | memoryview, tmp_path: Path) -> None:
    Checkpoint(tmp_path / "ckpt").save_sync(data)
    assert (tmp_path / "ckpt").read_bytes() == b"state"
