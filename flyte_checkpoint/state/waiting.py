"""Bounded waiting: deadlines, the caller's lock or pause hook, and a thread pool with a time limit."""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from typing import Any, TypeAlias, TypeVar

from flyte_checkpoint.errors import InvalidCheckpointInputError, UnsupportedTypeError
from flyte_checkpoint.state.failures import in_context, label_of, timed_out
from flyte_checkpoint.timebounds import Deadline

T = TypeVar("T")

DEFAULT_TIMEOUT = 600.0
"""Seconds a save, commit or load may take in all before it gives up (10 minutes)."""

DEFAULT_MAX_WORKERS = 8
"""Parts moved concurrently by one process."""

LockLike: TypeAlias = AbstractContextManager[Any] | Callable[[], AbstractContextManager[Any]]
"""A lock (``threading.Lock``, ``multiprocessing.Lock``, any context manager), or a pause hook: a
callable returning a context manager, e.g. ``lambda: trainer.paused()``."""


def check_timeout(timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout):
        raise InvalidCheckpointInputError(f"timeout must be a finite number of seconds, not {timeout!r}")
    if timeout <= 0:
        raise InvalidCheckpointInputError(f"timeout must be positive, not {timeout!r}")
    return float(timeout)


def check_max_workers(max_workers: int | None, jobs: int) -> int:
    if max_workers is None:
        return max(1, min(DEFAULT_MAX_WORKERS, jobs))
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise InvalidCheckpointInputError(f"max_workers must be a positive int, not {max_workers!r}")
    return max_workers


@contextlib.contextmanager
def held(lock: LockLike | None, deadline: Deadline, consequence: str) -> Iterator[None]:
    """Hold the caller's lock, or run inside its pause hook, for the block.

    An object with ``acquire``/``release`` (threading and multiprocessing locks) is acquired with
    the deadline's remaining time as its timeout, so a lock held elsewhere cannot hang a save. A
    plain context manager or pause hook is entered as is: its own code decides how long it waits.
    """
    if lock is None:
        yield
        return
    acquire = getattr(lock, "acquire", None)
    release = getattr(lock, "release", None)
    if callable(acquire) and callable(release):
        if inspect.iscoroutinefunction(acquire):
            raise UnsupportedTypeError(
                "an asyncio lock cannot guard a blocking save or load; pass a threading.Lock, or a "
                "pause hook (a callable returning a context manager)"
            )
        if not acquire(timeout=deadline.remaining()):
            raise timed_out(f"the lock was not free within {deadline.seconds:g} s; {consequence}")
        try:
            yield
        finally:
            release()
        return
    if isinstance(lock, AbstractContextManager):
        with lock:
            yield
        return
    if callable(lock):
        manager = lock()
        if not isinstance(manager, AbstractContextManager):
            raise UnsupportedTypeError(
                f"the pause hook returned {type(manager).__name__}, not a context manager"
            )
        with manager:
            yield
        return
    raise UnsupportedTypeError(
        f"lock must be a lock, a context manager, or a callable returning one, not {type(lock).__name__}"
    )


def run_bounded(
    jobs: Sequence[tuple[int | None, Callable[[], T]]],
    *,
    deadline: Deadline,
    max_workers: int | None,
    what: str,
    consequence: str,
) -> list[T]:
    """Run ``(position, job)`` pairs on a thread pool; results in order, or one clear error.

    The first failure (the lowest position among those failed by then) is raised with its part
    named; if the deadline passes first, the error names the parts still running. Threads that
    are still running are not waited for beyond the deadline.
    """
    if not jobs:
        return []
    executor = ThreadPoolExecutor(
        max_workers=check_max_workers(max_workers, len(jobs)), thread_name_prefix="flyte-cp-state"
    )
    futures: list[Future[T]] = []
    try:
        futures = [executor.submit(job) for _, job in jobs]
        done, pending = wait(futures, timeout=deadline.remaining(), return_when=FIRST_EXCEPTION)
        failed = [
            (position, future)
            for (position, _), future in zip(jobs, futures, strict=True)
            if future in done and future.exception() is not None
        ]
        if failed:
            position, future = min(failed, key=lambda item: -1 if item[0] is None else item[0])
            error = future.exception()
            assert error is not None
            contextual = in_context(error, position, consequence)
            if contextual is error:
                raise error
            raise contextual from error
        if pending:
            running = ", ".join(
                label_of(position)
                for (position, _), future in zip(jobs, futures, strict=True)
                if future in pending
            )
            raise timed_out(
                f"{what} did not finish within {deadline.seconds:g} s ({running} still "
                f"running); {consequence}"
            )
        return [future.result() for future in futures]
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        # In-flight jobs cannot be interrupted; let them finish within the deadline so no thread
        # outlives the call in the common case (a fast failure of one part among many).
        unfinished = [future for future in futures if not future.done()]
        if unfinished:
            wait(unfinished, timeout=deadline.remaining())
