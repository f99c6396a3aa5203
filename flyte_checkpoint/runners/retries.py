"""The local retry loop: run a task until it succeeds, staging each attempt's checkpoint for the next.

Two budgets: ``retries`` for attempts that failed (the task raised an exception) and
``preemption_retries`` for attempts ended by a preemption notice (``Preempted``), so being
preempted never uses up the retries meant for the task's own failures.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

from flyte_checkpoint.context import CheckpointPaths, TaskContext
from flyte_checkpoint.errors import InvalidCheckpointInputError, Preempted
from flyte_checkpoint.lockfiles import make_locked_directory, release_locked_directory
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.preemption.handler import install_preemption_handler
from flyte_checkpoint.runners.attempt import acall_task, attempt_scope, attempt_scope_async, call_task
from flyte_checkpoint.storage import TransferSettings, backend_for, copy_object
from flyte_checkpoint.uris import clean_uri, is_local, scheme_of

logger = logging.getLogger("flyte_checkpoint")

# The task's result type. Its arguments stay unchecked: PEP 612 allows no keyword-only
# parameters (retries=...) between *args: P.args and **kwargs: P.kwargs.
R = TypeVar("R")

DEFAULT_PREEMPTION_RETRIES = 10

RUN_DIRECTORY_PREFIX = "flyte-cp-run-"
"""The temporary checkpoint directory of a run given no ``checkpoint_dir``, in ``TMPDIR``."""


def join_location(base: str, name: str) -> str:
    """``base/name`` for a local path or a storage URI."""
    if is_local(base) and "://" not in base:
        return str(Path(base) / name)
    return f"{base.rstrip('/')}/{name}"


class _Budget:
    """Extra attempts of one kind: after failed attempts, or after preempted ones."""

    def __init__(self, name: str, allowed: object, counted_as: str, meaning: str) -> None:
        """``counted_as`` names one retry of this kind in logs: "retry 1 of 3", "preemption 1 of 10"."""
        if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 0:
            raise InvalidCheckpointInputError(
                f"{name} must be a whole number >= 0 ({meaning}), got {allowed!r}"
            )
        self.name = name
        self.allowed = allowed
        self.counted_as = counted_as
        self.used = 0


class RetryPlan:
    """What one retried run shares between its attempts, whichever way they are called.

    Attempts are numbered from 0 as their contexts' ``attempt_number`` is, whichever budget
    each retry came from; every log line and note uses that number.
    """

    def __init__(
        self,
        retries: int,
        checkpoint_dir: str | os.PathLike[str] | None,
        storage_options: Mapping[str, Any] | None,
        run_name: str | None,
        preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
        transfer: TransferSettings | None = None,
    ) -> None:
        self.retries = _Budget("retries", retries, "retry", "extra attempts after failed ones")
        self.preemption_retries = _Budget(
            "preemption_retries", preemption_retries, "preemption", "extra attempts after preempted ones"
        )
        self.number = 0
        """The attempt running now (or next)."""
        self.storage_options = storage_options
        self.transfer = transfer
        self.run_name = run_name
        self._own_dir: tuple[str, int] | None = None
        base = clean_uri(os.fspath(checkpoint_dir)) if checkpoint_dir is not None else None
        if base is None:
            # Locked while this process lives: a run killed before finish() leaves its
            # checkpoints behind, and the next run's sweep removes them (lockfiles.py).
            directory, lock_fd = make_locked_directory(Path(tempfile.gettempdir()), RUN_DIRECTORY_PREFIX)
            self._own_dir = (str(directory), lock_fd)
            base = str(directory)
        elif not scheme_of(base):
            # Absolute as of now: every attempt (and every rank it starts) names the same place,
            # whatever its working directory.
            base = str(Path(base).expanduser().absolute())
        try:
            # A misspelt option or a wrong transfer= fails the run now, naming it, instead of
            # failing every attempt the same way until the retries are spent.
            backend_for(base, storage_options, transfer=transfer)
        except BaseException:
            self.finish()
            raise
        self.paths = CheckpointPaths(
            checkpoint_path=join_location(base, "checkpoint"),
            prev_checkpoint_path=join_location(base, "prev_checkpoint"),
        )
        self.errors: list[BaseException] = []

    def context(self) -> TaskContext:
        """A fresh context for the next attempt: the attempt number travels in it, not in os.environ.

        A later attempt starts without the preemption notice an earlier one received (the
        notice is process-wide; :func:`.notice.clear`).
        """
        if self.number:
            notice.clear()
        logger.info("attempt %d starting", self.number)
        return TaskContext(
            checkpoint_paths=self.paths,
            run_name=self.run_name,
            storage_options=self.storage_options,
            transfer=self.transfer,
            attempt_number=self.number,
        )

    def failed(self, error: Exception) -> None:
        """Count the failure of this attempt against ``retries``; raise it when none are left."""
        self._retry_or_raise(error, "failed", f"{type(error).__name__}: {error}", self.retries)

    def preempted(self, error: Preempted) -> None:
        """Count the preemption of this attempt against ``preemption_retries``; raise it when none
        are left."""
        what = str(error).removeprefix("preempted by ")
        self._retry_or_raise(error, "preempted", what, self.preemption_retries)

    def _retry_or_raise(self, error: BaseException, ended: str, what: str, budget: _Budget) -> None:
        if self.errors:
            _chain(error, self.errors[-1])
        self.errors.append(error)
        if budget.used >= budget.allowed:
            exhausted = f"no {budget.name.replace('_', ' ')} left ({budget.name}={budget.allowed})"
            _note(error, f"flyte_checkpoint: attempt {self.number} {ended}; {exhausted}")
            raise error
        budget.used += 1
        counted = f"{budget.counted_as} {budget.used} of {budget.allowed}"
        retrying = f"retrying as attempt {self.number + 1} ({counted})"
        _note(error, f"flyte_checkpoint: attempt {self.number} {ended}; {retrying}")
        logger.warning("attempt %d %s (%s); %s", self.number, ended, what, retrying)
        self.number += 1

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
            transfer=self.transfer,
        )
        if staged:
            logger.info("staged %s for the next attempt", self.paths.checkpoint_path)

    def finish(self) -> None:
        """Remove the checkpoint directory if this plan created it: the runners call it once, as
        the run ends, however it ends."""
        if self._own_dir is not None:
            directory, lock_fd = self._own_dir
            self._own_dir = None
            release_locked_directory(directory, lock_fd)


@overload
def run_with_retries(
    fn: Callable[..., Coroutine[Any, Any, R]],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> R: ...


@overload
def run_with_retries(
    fn: Callable[..., R],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> R: ...


def run_with_retries(
    fn: Callable[..., Any],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` (``def`` or ``async def``) with up to ``retries`` retries.

    Each attempt gets a fresh :class:`TaskContext` (with its 0-based ``attempt_number``) whose
    checkpoint saves to ``<checkpoint_dir>/checkpoint`` and restores from
    ``<checkpoint_dir>/prev_checkpoint``; each retry starts by staging the last checkpoint into
    the previous location (a staging failure fails that attempt and uses up a retry). The default
    ``checkpoint_dir`` is a temporary directory removed at the end, however the run ends (a
    run killed outright leaves it to the next run's sweep). ``checkpoint_dir`` may be any
    storage URI; ``storage_options`` and ``transfer`` (:class:`~flyte_checkpoint.TransferSettings`)
    go to every attempt's helper and to the staging copy, and are checked before the first
    attempt: a misspelt option fails the run at once instead of every attempt. Returns the
    first successful result (awaited, for an ``async def`` task), typed as ``fn``'s, or
    re-raises the last attempt's error with the earlier attempts' errors chained as its context.

    Preemption: the preemption handler is installed for the run (from the main thread; elsewhere
    nothing is installed) and the previous signal handlers are restored when it returns or
    raises. ``grace_seconds`` is the time from SIGTERM to the expected SIGKILL (``None``:
    ``FLYTE_CHECKPOINT_GRACE_SECONDS``, else 30 s). An attempt that ends with
    :class:`~flyte_checkpoint.errors.Preempted` (``raise checkpoint.preemption()``, or the
    handler ending a task that does not handle the notice) was preempted, not failed: it is
    retried on its own budget of ``preemption_retries`` extra attempts without using one of
    ``retries``, the next attempt starts without the notice and resumes from the checkpoint
    staged as after a failure, and once the budget is spent the ``Preempted`` is re-raised
    (``preemption_retries=0`` re-raises the first, e.g. to let a real preemption end the
    process). Attempts are numbered from 0 in log lines and notes, as ``attempt_number`` is.
    """
    plan = RetryPlan(retries, checkpoint_dir, storage_options, run_name, preemption_retries, transfer)
    try:
        with install_preemption_handler(grace_seconds=grace_seconds):
            while True:
                context = plan.context()
                try:
                    with attempt_scope(context):
                        if plan.number:
                            plan.stage_previous()
                        return call_task(fn, args, kwargs)
                except Exception as error:
                    plan.failed(error)
                except Preempted as preempted:
                    plan.preempted(preempted)
    finally:
        plan.finish()  # on Ctrl-C too: nobody could find a temporary directory's checkpoints


@overload
async def run_with_retries_async(
    fn: Callable[..., Awaitable[R]],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> R: ...


@overload
async def run_with_retries_async(
    fn: Callable[..., R],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> R: ...


async def run_with_retries_async(
    fn: Callable[..., Any],
    *args: Any,
    retries: int,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    transfer: TransferSettings | None = None,
    run_name: str | None = None,
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES,
    grace_seconds: float | None = None,
    **kwargs: Any,
) -> Any:
    """:func:`run_with_retries` for callers inside an event loop.

    Nothing blocks the loop: ``def`` tasks, staging, closing each attempt's helper (which waits
    for a background save to finish) and removing a temporary ``checkpoint_dir`` run in worker
    threads. Preemption as in :func:`run_with_retries`, except that a task that does not handle
    the notice is ended by cancelling it (it sees ``CancelledError`` at the ``await`` it is in),
    and a ``def`` task, running in a worker thread, cannot be ended from outside at all: read
    ``checkpoint.preempted`` in its loop.
    """
    plan = await asyncio.to_thread(
        RetryPlan, retries, checkpoint_dir, storage_options, run_name, preemption_retries, transfer
    )
    try:
        with install_preemption_handler(grace_seconds=grace_seconds):
            while True:
                context = plan.context()
                try:
                    async with attempt_scope_async(context):
                        if plan.number:
                            await asyncio.to_thread(plan.stage_previous)
                        return await acall_task(fn, args, kwargs)
                except Exception as error:
                    await asyncio.to_thread(plan.failed, error)
                except Preempted as preempted:
                    await asyncio.to_thread(plan.preempted, preempted)
    finally:
        # Shielded: a cancelled run still removes a temporary directory, off the loop.
        await asyncio.shield(asyncio.to_thread(plan.finish))


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
