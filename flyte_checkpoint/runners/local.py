"""The local retry loop: run a task until it succeeds, staging each attempt's checkpoint for the next."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from flyte_checkpoint.context import CheckpointPaths, TaskContext
from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.runners.runtime import acall_task, attempt_scope, attempt_scope_async, call_task
from flyte_checkpoint.storage import copy_object
from flyte_checkpoint.uris import clean_uri, is_local

logger = logging.getLogger("flyte_checkpoint")

# The task's result type. Its arguments stay unchecked: PEP 612 allows no keyword-only
# parameters (retries=...) between *args: P.args and **kwargs: P.kwargs.
R = TypeVar("R")


def join_location(base: str, name: str) -> str:
    """``base/name`` for a local path or a storage URI."""
    if is_local(base) and "://" not in base:
        return str(Path(base) / name)
    return f"{base.rstrip('/')}/{name}"


class RetryPlan:
    """What one retried run shares between its attempts, whichever way they are called."""

    def __init__(
        self,
        retries: int,
        checkpoint_dir: str | os.PathLike[str] | None,
        storage_options: Mapping[str, Any] | None,
        run_name: str | None,
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise InvalidCheckpointInputError(
                f"retries must be a whole number >= 0 (extra attempts after the first), got {retries!r}"
            )
        self.retries = retries
        self.storage_options = storage_options
        self.run_name = run_name
        self._own_dir: str | None = None
        base = clean_uri(os.fspath(checkpoint_dir)) if checkpoint_dir is not None else None
        if base is None:
            self._own_dir = base = tempfile.mkdtemp(prefix="flyte-cp-run-")
        self.paths = CheckpointPaths(
            checkpoint_path=join_location(base, "checkpoint"),
            prev_checkpoint_path=join_location(base, "prev_checkpoint"),
        )
        self.errors: list[Exception] = []

    @property
    def attempts(self) -> range:
        return range(self.retries + 1)

    def context_for(self, number: int) -> TaskContext:
        """A fresh context for attempt ``number``: the attempt number travels in it, not in os.environ."""
        logger.info("attempt %d of %d", number + 1, self.retries + 1)
        return TaskContext(
            checkpoint_paths=self.paths,
            run_name=self.run_name,
            storage_options=self.storage_options,
            attempt_number=number,
        )

    def failed(self, number: int, error: Exception) -> None:
        """Record the failure of attempt ``number``; raise the last error when none are left."""
        _note(error, f"flyte_checkpoint: attempt {number + 1} of {self.retries + 1} failed")
        if self.errors:
            _chain(error, self.errors[-1])
        self.errors.append(error)
        if number >= self.retries:
            self.finish()
            raise error
        logger.warning("attempt %d failed (%s: %s); retrying", number + 1, type(error).__name__, error)

    def stage_previous(self) -> None:
        """Copy the last attempt's checkpoint object to the previous-checkpoint location.

        Called at the start of every retry, as part of it: a copy that fails (the store is down)
        fails that attempt and uses up a retry like any other failure. An attempt that saved
        nothing leaves the destination as it was, so the copy brings the newest checkpoint any
        attempt saved. The copy is atomic at the previous location.
        """
        assert self.paths.checkpoint_path
        assert self.paths.prev_checkpoint_path
        staged = copy_object(
            self.paths.checkpoint_path,
            self.paths.prev_checkpoint_path,
            src_options=self.storage_options,
            dst_options=self.storage_options,
        )
        if staged:
            logger.info("staged %s for the next attempt", self.paths.checkpoint_path)

    def finish(self) -> None:
        """Remove the checkpoint directory if this plan created it."""
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)


@overload
def run_with_retries(
    fn: Callable[..., Coroutine[Any, Any, R]],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> R: ...


@overload
def run_with_retries(
    fn: Callable[..., R],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> R: ...


def run_with_retries(
    fn: Callable[..., Any],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` (``def`` or ``async def``) with up to ``retries`` retries.

    Each attempt gets a fresh :class:`TaskContext` (with its 0-based ``attempt_number``) whose
    checkpoint saves to ``<checkpoint_dir>/checkpoint`` and restores from
    ``<checkpoint_dir>/prev_checkpoint``; each retry starts by staging the last checkpoint into
    the previous location (a staging failure fails that attempt and uses up a retry). The default
    ``checkpoint_dir`` is a temporary directory removed at the end. ``checkpoint_dir`` may be any
    storage URI. Returns the first successful result (awaited, for an ``async def`` task), typed
    as ``fn``'s, or re-raises the last attempt's error with the earlier attempts' errors chained
    as its context.
    """
    plan = RetryPlan(retries, checkpoint_dir, storage_options, run_name)
    for number in plan.attempts:
        context = plan.context_for(number)
        try:
            with attempt_scope(context):
                if number:
                    plan.stage_previous()
                result = call_task(fn, args, kwargs)
        except Exception as error:
            plan.failed(number, error)
            continue
        plan.finish()
        return result
    raise AssertionError("unreachable: the last failed attempt raises")  # pragma: no cover


@overload
async def run_with_retries_async(
    fn: Callable[..., Awaitable[R]],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> R: ...


@overload
async def run_with_retries_async(
    fn: Callable[..., R],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> R: ...


async def run_with_retries_async(
    fn: Callable[..., Any],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    run_name: str | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`run_with_retries` for callers inside an event loop.

    Nothing blocks the loop: ``def`` tasks, staging, closing each attempt's helper (which waits
    for a background save to finish) and removing a temporary ``checkpoint_dir`` run in worker
    threads.
    """
    plan = await asyncio.to_thread(RetryPlan, retries, checkpoint_dir, storage_options, run_name)
    for number in plan.attempts:
        context = plan.context_for(number)
        try:
            async with attempt_scope_async(context):
                if number:
                    await asyncio.to_thread(plan.stage_previous)
                result = await acall_task(fn, args, kwargs)
        except Exception as error:
            await asyncio.to_thread(plan.failed, number, error)
            continue
        await asyncio.to_thread(plan.finish)
        return result
    raise AssertionError("unreachable: the last failed attempt raises")  # pragma: no cover


def _note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)


def _chain(error: BaseException, earlier: BaseException) -> None:
    """Hang ``earlier`` at the end of ``error``'s context chain, so tracebacks show every attempt."""
    seen = {id(error)}
    tail = error
    while tail.__context__ is not None:
        if id(tail.__context__) in seen or tail.__context__ is earlier:
            return
        seen.add(id(tail.__context__))
        tail = tail.__context__
    if tail is not earlier:
        tail.__context__ = earlier
