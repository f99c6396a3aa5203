"""TaskContext, CheckpointPaths and ctx(): how task code reaches its checkpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path

import pydantic
import pytest

from flyte_checkpoint import (
    CHECKPOINT_CACHE_KEY,
    Checkpoint,
    CheckpointPaths,
    ConfigurationError,
    TaskContext,
    ctx,
    task_context,
)


def paths(tmp_path: Path) -> CheckpointPaths:
    return CheckpointPaths(prev_checkpoint_path=str(tmp_path / "prev"), checkpoint_path=str(tmp_path / "cur"))


def test_checkpoint_paths_is_frozen(tmp_path: Path) -> None:
    value = paths(tmp_path)
    with pytest.raises(pydantic.ValidationError):
        value.checkpoint_path = "elsewhere"


def test_checkpoint_paths_rejects_non_string_locations() -> None:
    with pytest.raises(pydantic.ValidationError):
        CheckpointPaths(checkpoint_path=42)  # type: ignore[arg-type]


def test_task_context_is_a_frozen_keyword_only_dataclass(tmp_path: Path) -> None:
    context = TaskContext(checkpoint_paths=paths(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.checkpoint_paths = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        TaskContext(paths(tmp_path))  # type: ignore[call-arg]


def test_a_context_without_paths_has_no_checkpoint() -> None:
    assert TaskContext().checkpoint is None


@pytest.mark.parametrize("destination", [None, "", "   ", "\t\n"])
def test_a_missing_or_whitespace_destination_has_no_checkpoint(destination: str | None) -> None:
    context = TaskContext(checkpoint_paths=CheckpointPaths(checkpoint_path=destination))
    assert context.checkpoint is None


def test_the_checkpoint_is_built_from_stripped_paths(tmp_path: Path) -> None:
    context = TaskContext(
        checkpoint_paths=CheckpointPaths(
            checkpoint_path=f"  {tmp_path}/cur \n", prev_checkpoint_path=f" {tmp_path}/prev "
        )
    )
    checkpoint = context.checkpoint
    assert isinstance(checkpoint, Checkpoint)
    assert checkpoint.remote_destination == f"{tmp_path}/cur"
    assert checkpoint.remote_source == f"{tmp_path}/prev"


def test_repeated_access_returns_the_same_cached_helper(tmp_path: Path) -> None:
    context = TaskContext(checkpoint_paths=paths(tmp_path))
    first = context.checkpoint
    assert first is not None
    assert context.checkpoint is first
    assert context.data[CHECKPOINT_CACHE_KEY] is first


def test_racing_first_accesses_agree_on_one_helper(tmp_path: Path) -> None:
    context = TaskContext(checkpoint_paths=paths(tmp_path))
    seen: list[Checkpoint | None] = []
    threads = [threading.Thread(target=lambda: seen.append(context.checkpoint)) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(helper) for helper in seen}) == 1


def test_attempt_number_defaults_to_zero() -> None:
    assert TaskContext().attempt_number == 0


def test_attempt_number_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "3")
    assert TaskContext().attempt_number == 3


def test_a_non_integer_attempt_number_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "three")
    with pytest.raises(ConfigurationError, match="FLYTE_ATTEMPT_NUMBER='three'"):
        _ = TaskContext().attempt_number


def test_ctx_is_none_outside_a_task() -> None:
    assert ctx() is None


def test_task_context_sets_ctx_for_the_block_and_restores_it() -> None:
    outer = TaskContext(run_name="outer")
    inner = TaskContext(run_name="inner")
    with task_context(outer):
        assert ctx() is outer
        with task_context(inner):
            assert ctx() is inner
        assert ctx() is outer
    assert ctx() is None


async def test_ctx_is_separate_per_asyncio_task() -> None:
    async def run_as(name: str) -> str | None:
        with task_context(TaskContext(run_name=name)):
            await asyncio.sleep(0.01)
            current = ctx()
            return current.run_name if current else None

    assert list(await asyncio.gather(run_as("a"), run_as("b"))) == ["a", "b"]


def test_ctx_does_not_leak_into_other_threads() -> None:
    seen: list[TaskContext | None] = []
    with task_context(TaskContext(run_name="main")):
        thread = threading.Thread(target=lambda: seen.append(ctx()))
        thread.start()
        thread.join()
    assert seen == [None]


async def test_ctx_follows_work_handed_to_a_thread_by_asyncio() -> None:
    context = TaskContext(run_name="handed")
    with task_context(context):
        assert await asyncio.to_thread(ctx) is context


def test_a_checkpoint_built_in_a_task_repairs_remote_sources_with_the_context_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "2")
    context = TaskContext(
        checkpoint_paths=CheckpointPaths(
            checkpoint_path="s3://bucket/data/run1/act/2/cp",
            prev_checkpoint_path="s3://bucket/data/run1/act/2/prev",
        ),
        run_name="run1",
        action_name="act",
    )
    assert context.checkpoint is not None
    assert context.checkpoint.remote_source == "s3://bucket/data/run1/act/1/prev"
