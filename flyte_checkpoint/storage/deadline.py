"""An overall time bound on one save or load through an object store, whatever it waits for.

Per-request timeouts (botocore's ``read_timeout``, gcsfs's ``requests_timeout``, Azure's
``read_timeout``) do not bound an operation: fsspec's ``sync`` waits without a limit for the
coroutine it runs on its event-loop thread, clients retry, and a server that accepts connections
but stops answering (a stopped process, a black-holed route) kept a save waiting for more than
ten minutes. A :class:`TransferBound` bounds the whole operation instead:

* the caller's blocking waits on futures of the store's loop (:meth:`TransferBound.result`,
  :meth:`TransferBound.wait_any`) time out when it passes, and
* every task started on the store's loop on behalf of the operation -- by fsspec's ``sync``
  inside s3fs, gcsfs and adlfs file objects, or by :mod:`.parallel` -- is cancelled when it
  passes, so a thread blocked in fsspec's ``sync`` wakes up. Such tasks are recognised by a
  context variable that :meth:`TransferBound.scope` sets around each call into the client: asyncio
  copies the caller's context into the tasks it creates, and a task factory installed on the
  loop files them under their deadline.

One :class:`_Watchdog` per loop keeps a single timer, for the soonest bound in force, instead
of each operation arming and disarming its own: both were calls from the caller's thread into
the loop's thread, and each such wake-up cost the caller about 60 us, a sixth of a 1 KiB save's
own work. Bounds only grow (:meth:`TransferBound.allow_for`), so an operation started after another
one with the same bound never moves the timer forward, and back-to-back operations wake the
loop only for their own requests.

The operation then raises :class:`~flyte_checkpoint.errors.CheckpointTimeoutError` (never
retried by :class:`~flyte_checkpoint.storage.retry.RetryPolicy`: the bound is on the whole
call). A save that times out is aborted, and its upload was never completed, so the previous
object stays.

The bound is the storage option ``transfer_timeout`` when given; by default it is
:data:`BASE_SECONDS` plus :data:`SECONDS_PER_MIB` for every MiB the transfer moves (known up
front for loads and file saves, counted as it is written for directory saves): an operation
averaging less than 1 MiB/s after two minutes is taken as stuck.

A caller may also set a *ceiling* for the operations it starts (:func:`finish_by`): a
:class:`~flyte_checkpoint.timebounds.Deadline` no bound passes, whatever the store. A save made
after a preemption notice is bounded so by the time left before the expected SIGKILL. Writers
read it when they are made (:func:`deadline_in_force`) so a local save, which has no store loop,
checks it too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from flyte_checkpoint.errors import CheckpointTimeoutError
from flyte_checkpoint.timebounds import Deadline

T = TypeVar("T")

BASE_SECONDS = 120.0
"""The default bound of an operation moving nothing (a 1 KiB save, a load's first request)."""
SECONDS_PER_MIB = 1.0
"""What the default bound adds per MiB moved: a transfer averaging under 1 MiB/s is stuck."""
ABORT_SECONDS = 30.0
"""The most an abort of a timed-out or failed upload may wait."""
MIN_ABORT_SECONDS = 5.0
"""The least an abort may wait, even after an operation with a shorter ``transfer_timeout``."""
CLEANUP_PAST_CEILING_SECONDS = 0.2
"""The most an abort may wait once the operation's ceiling (a preemption's save deadline) passed."""
_MiB = 1 << 20

_current: contextvars.ContextVar[TransferBound | None] = contextvars.ContextVar(
    "flyte_checkpoint_deadline", default=None
)


def stopped_by(ceiling: Deadline, action: str, uri: str) -> CheckpointTimeoutError:
    """The error of an operation on ``uri`` that ``ceiling`` stopped (of its ``error_type``)."""
    return ceiling.error_type(
        f"{action} {uri} was stopped: it could not finish before {ceiling.reason}; the previous "
        "checkpoint is kept, unless the store had already received the whole object (a single "
        "request already sent completes on the store's side)"
    )


_ceiling: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "flyte_checkpoint_ceiling", default=None
)


@contextlib.contextmanager
def finish_by(ceiling: Deadline | None) -> Iterator[None]:
    """Operations started in this block (this thread or task) end by ``ceiling`` at the latest;
    ``None`` adds no bound. A sooner ceiling already in force stays."""
    outer = _ceiling.get()
    if ceiling is None or (outer is not None and outer.at <= ceiling.at):
        yield
        return
    token = _ceiling.set(ceiling)
    try:
        yield
    finally:
        _ceiling.reset(token)


def deadline_in_force() -> Deadline | None:
    """The ceiling in force for operations started here, if any (see :func:`finish_by`)."""
    return _ceiling.get()


_TIMER_SLACK = 0.01
"""Seconds the watchdog's timer runs past a bound, so the bound has surely passed when it fires."""
_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog] = weakref.WeakKeyDictionary()
_watchdogs_lock = threading.Lock()


def _forget_the_parents_loops() -> None:
    """In a forked child: none of the parent's loop threads run there (fsspec starts a new
    loop), and a lock one of them held at the fork would never be released."""
    global _watchdogs_lock
    _watchdogs_lock = threading.Lock()
    _watchdogs.clear()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_forget_the_parents_loops)


class TransferBound:
    """The bound on one save or load: the moment it must be finished by (grown with the bytes it
    moves, capped by the ceiling in force), and the waits and tasks that moment ends."""

    def __init__(
        self,
        uri: str,
        action: str,
        *,
        loop: asyncio.AbstractEventLoop | None,
        seconds: float | None = None,
        size: int | None = None,
        ceiling: Deadline | bool | None = True,
    ) -> None:
        """``seconds`` fixes the bound (the ``transfer_timeout`` option); without it the bound
        is the default one for ``size`` bytes, grown by :meth:`allow_for` as bytes move.
        ``ceiling``: ``True`` takes the one in force (:func:`finish_by`), else the one given."""
        self._uri = uri
        self._action = action
        self._loop = loop
        self._started = time.monotonic()
        self._fixed = seconds
        self._moved = size or 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watchdog: _Watchdog | None = None
        self._ceiling = deadline_in_force() if ceiling is True else (ceiling or None)
        self.fired = False
        """Whether the bound passed and the operation's tasks were cancelled."""

    @property
    def seconds(self) -> float:
        """The bound, in seconds from the start of the operation (as far as it is known yet)."""
        if self._fixed is not None:
            return self._fixed
        return BASE_SECONDS + SECONDS_PER_MIB * self._moved / _MiB

    def allow_for(self, moved: int) -> None:
        """``moved`` bytes are known to be part of the transfer: a default bound grows with them."""
        self._moved = max(self._moved, moved)

    def remaining(self) -> float:
        return max(0.0, self.expires_at() - time.monotonic())

    def expires_at(self) -> float:
        """The ``time.monotonic()`` at which the bound passes (as far as it is known yet)."""
        own = self._started + self.seconds
        return own if self._ceiling is None else min(own, self._ceiling.at)

    def abort_seconds(self) -> float:
        """How long cleaning up after a failure may take: the operation's own bound, but at
        least :data:`MIN_ABORT_SECONDS` (a store answering slowly is why a bound passed) and at
        most :data:`ABORT_SECONDS`."""
        return min(ABORT_SECONDS, max(MIN_ABORT_SECONDS, self.seconds))

    def for_cleanup(self) -> TransferBound:
        """A new bound of :meth:`abort_seconds` for cleaning up after this operation failed; of
        :data:`CLEANUP_PAST_CEILING_SECONDS` at most once its ceiling has passed."""
        action = f"cleaning up after {self._action}"
        seconds = self.abort_seconds()
        if self._ceiling is not None and self._ceiling.expired:
            # A preemption's save deadline passed: what is left of the grace period is the
            # process's to exit in, and an abort waited for (5 s at least) ran into the SIGKILL in
            # an outside harness. An upload left unfinished is swept by the run's next attempt.
            seconds = min(seconds, CLEANUP_PAST_CEILING_SECONDS)
        # Not under the ceiling: an abort must run even once the operation itself ran out of time.
        return TransferBound(self._uri, action, loop=self._loop, seconds=seconds, ceiling=None)

    def expired(self) -> CheckpointTimeoutError:
        """The error to raise now that the bound has passed."""
        if self._ceiling is not None and self._ceiling.at < self._started + self.seconds:
            return stopped_by(self._ceiling, self._action, self._uri)
        option = "transfer_timeout" if self._fixed is not None else "default bound (set transfer_timeout)"
        return CheckpointTimeoutError(
            f"{self._action} {self._uri} did not finish within {self.seconds:.0f} s (its {option}); "
            "the store stopped answering or the network is too slow: check the storage endpoint "
            "and network, or raise the storage option transfer_timeout"
        )

    # blocking waits of the caller's thread

    def wait_any(
        self, futures: Sequence[concurrent.futures.Future[Any]], *, within: float | None = None
    ) -> set[concurrent.futures.Future[Any]]:
        """Block until one of ``futures`` is done (interruptible by Ctrl-C); return the done ones.

        With ``within``, return (maybe an empty set) after that many seconds at the most, so the
        caller can look at something else between waits; the bound still raises when it passes.
        """
        remaining = self.remaining()
        bounded = within is None or remaining <= within
        done, _ = concurrent.futures.wait(
            futures, timeout=remaining if bounded else within, return_when=concurrent.futures.FIRST_COMPLETED
        )
        if self.fired or (not done and bounded):
            raise self.expired()
        return done

    def result(self, future: concurrent.futures.Future[T]) -> T:
        """``future``'s result, waiting no longer than the bound allows."""
        try:
            return future.result(timeout=self.remaining())
        except concurrent.futures.TimeoutError:
            if future.done() and not future.cancelled():
                # The operation's own TimeoutError (one class with this wait's since Python
                # 3.11: aiohttp's request timeout), not the bound: raise it as it is.
                return future.result()
            future.cancel()
            raise self.expired() from None
        except concurrent.futures.CancelledError:
            if self.fired:
                raise self.expired() from None
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the store's loop as one of this operation's tasks."""
        assert self._loop is not None
        with self.scope():
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # tasks on the store's loop

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Calls into the store client inside this block start tasks this deadline cancels.

        A call that a cancellation ended -- fsspec's ``sync`` then returns ``None`` or raises
        whatever the interrupted code made of it -- raises :meth:`expired` instead.
        """
        if self.remaining() <= 0:
            self.fired = True
            raise self.expired()
        if self._loop is not None:
            self._arm()
        token = _current.set(self)
        try:
            yield
        except BaseException as exc:
            if self.fired:
                raise self.expired() from exc
            raise
        finally:
            _current.reset(token)
        if self.fired:
            raise self.expired()

    def finish(self) -> None:
        """The operation is over: stop watching it (no wake-up of the loop: see :class:`_Watchdog`)."""
        if self._watchdog is not None:
            self._watchdog.forget(self)

    def _arm(self) -> None:
        if self._watchdog is None:
            assert self._loop is not None
            self._watchdog = _watchdog_for(self._loop)
            self._watchdog.watch(self)

    def _fire(self) -> None:  # on the loop
        self.fired = True
        for task in list(self._tasks):
            task.cancel()

    def _adopt(self, task: asyncio.Task[Any]) -> None:  # on the loop
        if self.fired:
            task.cancel()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def outside_deadlines(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """Start ``coro`` on the running loop as a task no deadline adopts or cancels.

    For work whose result a cleanup needs even after the operation's bound passed (the id of a
    multipart upload, so that it can be aborted). The task's context is a fresh, empty one.
    """
    loop = asyncio.get_running_loop()
    return contextvars.Context().run(loop.create_task, coro)


def _sync_wakeup(coro: Any) -> threading.Event | None:
    """The event a thread blocked in fsspec's ``sync`` waits for, if ``coro`` is its runner.

    The runner sets it in a ``finally``, which a task cancelled before its first step never
    enters: the thread would wait forever. The deadline sets it when such a task ends instead.
    """
    try:
        from fsspec.asyn import _runner
    except ImportError:  # pragma: no cover - fsspec comes with every object store
        return None
    if getattr(coro, "cr_code", None) is not _runner.__code__ or coro.cr_frame is None:
        return None
    event = coro.cr_frame.f_locals.get("event")
    return event if isinstance(event, threading.Event) else None


class _Watchdog:
    """The deadlines in force on one loop, and one timer for the soonest of them.

    :meth:`watch` and :meth:`forget` are called from any thread; the timer lives on the loop.
    Watching wakes the loop only when the new bound passes before the timer would fire (the
    first operation, or a short ``transfer_timeout`` after a long one); forgetting never does:
    a timer that fires with nothing due just finds the next soonest bound, or stops.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the loop is this watchdog's key in ``_watchdogs``, which a strong reference from
        # its value would keep alive (and every loop that ever ran an operation with it).
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._watched: set[TransferBound] = set()
        self._fires_at = float("inf")
        """When the timer fires, under ``_lock`` (``inf``: no timer; ``-inf``: a reschedule is queued)."""
        self._timer: weakref.ref[asyncio.TimerHandle] | None = None  # on the loop only
        """Weak too: a handle refers to its loop; the loop holds it while it is pending."""

    def watch(self, deadline: TransferBound) -> None:
        with self._lock:
            self._watched.add(deadline)
            if deadline.expires_at() + _TIMER_SLACK >= self._fires_at:
                return  # the timer fires first and will find this one
            self._fires_at = float("-inf")  # a reschedule is on its way: later watches need none
        loop = self._loop()
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a loop closed at interpreter exit
                loop.call_soon_threadsafe(self._reschedule)

    def forget(self, deadline: TransferBound) -> None:
        with self._lock:
            self._watched.discard(deadline)

    def _reschedule(self) -> None:  # on the loop
        """Fire the deadlines that have passed; set the timer for the soonest of the others."""
        pending = self._timer() if self._timer is not None else None
        if pending is not None:
            pending.cancel()
        self._timer = None
        now = time.monotonic()
        with self._lock:
            due = {deadline for deadline in self._watched if deadline.expires_at() <= now}
            self._watched -= due
            soonest = min((deadline.expires_at() for deadline in self._watched), default=None)
            fires_at = float("inf") if soonest is None else soonest + _TIMER_SLACK
            self._fires_at = fires_at
        for deadline in due:
            deadline._fire()
        loop = self._loop()
        if soonest is not None and loop is not None:
            self._timer = weakref.ref(loop.call_later(fires_at - now, self._reschedule))


def _watchdog_for(loop: asyncio.AbstractEventLoop) -> _Watchdog:
    """The loop's watchdog; the first call also files the loop's tasks under their deadlines."""
    with _watchdogs_lock:
        watchdog = _watchdogs.get(loop)
        if watchdog is None:
            watchdog = _watchdogs[loop] = _Watchdog(loop)
            # Queued under the lock, so before the first coroutine of any thread that finds
            # this watchdog: the factory is in place when that coroutine's task is created.
            loop.call_soon_threadsafe(_install_factory, loop)
        return watchdog


def _install_factory(loop: asyncio.AbstractEventLoop) -> None:
    """File every task the loop creates under the deadline of the context it is created in."""
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        if previous is not None:
            task = previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.get("context")
        deadline = context.get(_current) if context is not None else _current.get()
        if deadline is not None and isinstance(task, asyncio.Task):
            event = _sync_wakeup(coro)
            if event is not None:
                task.add_done_callback(lambda _: event.set())
            deadline._adopt(task)
        return task

    loop.set_task_factory(factory)
