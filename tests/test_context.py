"""TaskContext, CheckpointPaths and ctx(): how task code reaches its checkpoint."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

import flyte_checkpoint.context
import flyte_checkpoint.single.checkpoint
from flyte_checkpoint import (
    CHECKPOINT_CACHE_KEY,
    Checkpoint,
    CheckpointPaths,
    ConfigurationError,
    TaskContext,
    ctx,
    task_context,
)
from flyte_checkpoint.context import ContextProvider, register_context_provider, unregister_context_provider


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


def test_the_checkpoint_helper_finds_the_running_task_without_importing_the_context_module() -> None:
    """The context builds the helper; the helper reads the running attempt from the layer below."""
    tree = ast.parse(Path(flyte_checkpoint.single.checkpoint.__file__).read_text(encoding="utf-8"))
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "flyte_checkpoint.context" not in imported


def test_attempt_number_defaults_to_zero() -> None:
    assert TaskContext().attempt_number == 0


def test_attempt_number_is_a_field_of_the_context() -> None:
    assert TaskContext(attempt_number=4).attempt_number == 4


def test_an_unset_attempt_number_is_read_from_the_environment_when_the_context_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "3")
    context = TaskContext()
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "7")
    assert context.attempt_number == 3


def test_a_given_attempt_number_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "3")
    assert TaskContext(attempt_number=1).attempt_number == 1


def test_a_non_integer_attempt_number_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "three")
    with pytest.raises(ConfigurationError, match="FLYTE_ATTEMPT_NUMBER='three'"):
        TaskContext()


@pytest.mark.parametrize("number", [-1, True, 1.0])
def test_an_attempt_number_that_is_not_a_whole_number_is_refused(number: object) -> None:
    with pytest.raises(ConfigurationError, match="attempt_number"):
        TaskContext(attempt_number=number)  # type: ignore[arg-type]


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


def second_attempt_on_s3() -> TaskContext:
    """Attempt 2 of action ``act`` in run ``run1``, whose executor named the source after attempt 2."""
    return TaskContext(
        checkpoint_paths=CheckpointPaths(
            checkpoint_path="s3://bucket/data/run1/act/2/cp",
            prev_checkpoint_path="s3://bucket/data/run1/act/2/prev",
        ),
        run_name="run1",
        action_name="act",
        attempt_number=2,
    )


def test_a_checkpoint_built_in_a_task_repairs_remote_sources_with_the_context_names_and_attempt() -> None:
    context = second_attempt_on_s3()
    assert context.checkpoint is not None
    assert context.checkpoint.remote_source == "s3://bucket/data/run1/act/1/prev"


def test_the_helper_is_repaired_with_its_own_context_even_inside_another_one() -> None:
    """The source segment 2 is repaired for attempt 2 (the helper's context), not attempt 5."""
    helper_context = second_attempt_on_s3()
    with task_context(TaskContext(run_name="other", action_name="other", attempt_number=5)):
        checkpoint = helper_context.checkpoint
    assert checkpoint is not None
    assert checkpoint.remote_source == "s3://bucket/data/run1/act/1/prev"


# -- context providers: how a platform integration makes ctx() see its running task ----------------


@pytest.fixture
def provide() -> Iterator[list[ContextProvider]]:
    """Register providers for one test; every one is unregistered afterwards."""
    registered: list[ContextProvider] = []
    yield registered
    for provider in registered:
        unregister_context_provider(provider)


def _register(registered: list[ContextProvider], provider: ContextProvider) -> None:
    registered.append(provider)
    register_context_provider(provider)


def test_ctx_asks_a_registered_provider_outside_a_task_context_block(
    provide: list[ContextProvider],
) -> None:
    platform = TaskContext(run_name="platform")
    _register(provide, lambda: platform)
    assert ctx() is platform


def test_a_task_context_block_wins_over_the_providers(provide: list[ContextProvider]) -> None:
    _register(provide, lambda: TaskContext(run_name="platform"))
    own = TaskContext(run_name="own")
    with task_context(own):
        assert ctx() is own


def test_a_provider_answering_none_lets_the_next_one_answer(provide: list[ContextProvider]) -> None:
    platform = TaskContext(run_name="platform")
    _register(provide, lambda: platform)
    _register(provide, lambda: None)
    assert ctx() is platform


def test_the_provider_registered_last_is_asked_first(provide: list[ContextProvider]) -> None:
    first, second = TaskContext(run_name="first"), TaskContext(run_name="second")
    _register(provide, lambda: first)
    _register(provide, lambda: second)
    assert ctx() is second


def test_an_unregistered_provider_is_no_longer_asked() -> None:
    def platform() -> TaskContext:
        return TaskContext(run_name="platform")

    register_context_provider(platform)
    register_context_provider(platform)  # twice: still one entry
    unregister_context_provider(platform)
    assert ctx() is None
    unregister_context_provider(platform)  # not registered: ignored
