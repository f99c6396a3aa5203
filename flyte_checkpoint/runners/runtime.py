"""Running one task attempt inside its :class:`TaskContext`, as a platform's container entry does."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from flyte_checkpoint.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint
from flyte_checkpoint.context import CheckpointPaths, TaskContext, attempt_number_from_env, task_context
from flyte_checkpoint.errors import ConfigurationError

TaskFunction = Callable[..., Any]


def resolve_task(reference: str | TaskFunction) -> TaskFunction:
    """The function named by ``"package.module:function"`` (or the callable itself)."""
    if callable(reference):
        return reference
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"task reference {reference!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import module {module_name!r} for task {reference!r}: {exc}; check the "
            "name and that it is importable (PYTHONPATH)"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise ConfigurationError(f"task reference {reference!r} is not callable")
    return target  # type: ignore[no-any-return]


def _close_helper(context: TaskContext) -> None:
    """Close the checkpoint helper the attempt built, if it asked for one (never builds one)."""
    helper = context.data.get(CHECKPOINT_CACHE_KEY)
    if isinstance(helper, Checkpoint):
        helper.close()


@contextlib.contextmanager
def attempt_scope(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` current for one attempt and close its checkpoint helper afterwards."""
    try:
        with task_context(context):
            yield context
    finally:
        _close_helper(context)


@contextlib.asynccontextmanager
async def attempt_scope_async(context: TaskContext) -> AsyncIterator[TaskContext]:
    """:func:`attempt_scope` for async runners: the helper is closed in a worker thread.

    Closing waits for a background save to finish uploading and removes the workspace, which
    may take as long as the save itself; the event loop keeps serving other tasks meanwhile.
    """
    try:
        with task_context(context):
            yield context
    finally:
        await asyncio.to_thread(_close_helper, context)


def call_task(fn: TaskFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call a ``def`` or ``async def`` task function from synchronous code."""
    if inspect.iscoroutinefunction(fn):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(fn(*args, **kwargs))
        raise RuntimeError(
            f"{fn.__qualname__} is async and an event loop is already running in this thread; "
            "await the async runner (run_with_retries_async) instead"
        )
    return fn(*args, **kwargs)


async def acall_task(fn: TaskFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """Call a ``def`` (in a worker thread) or ``async def`` task function from async code."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def load_and_run_task(
    task: str | TaskFunction,
    *,
    checkpoint_paths: CheckpointPaths | None,
    inputs: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    action_name: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    attempt_number: int | None = None,
) -> Any:
    """Run ``task`` once with ``inputs`` as keyword arguments, inside a fresh :class:`TaskContext`.

    This is what a platform's container entry does for one attempt: the checkpoint locations come
    from ``checkpoint_paths``, the attempt number from ``attempt_number`` or, when that is
    ``None``, from ``FLYTE_ATTEMPT_NUMBER`` (read once, into the context; 0 when unset).
    """
    fn = resolve_task(task)
    context = TaskContext(
        checkpoint_paths=checkpoint_paths,
        run_name=run_name,
        action_name=action_name,
        storage_options=storage_options,
        attempt_number=attempt_number_from_env() if attempt_number is None else attempt_number,
    )
    with attempt_scope(context):
        return call_task(fn, (), dict(inputs or {}))
