"""Jobs on a shared pool, picked so that its threads write different files at once.

The kernel lets one write into a file at a time (the inode's lock), so two threads that load
consecutive members of one file take turns at its writes; measured here on 2 cores, reading,
checking and writing 1 GiB of weights went 1.6x faster on two threads than on one when both
wrote the same file, 1.9x when each wrote its own. So a load's jobs go into *lanes*, one per
file whose data they write: a free thread takes the next job of the oldest lane no other thread
is working on (of the oldest lane, when every lane has a thread), and within a lane the jobs
run in the order they came. A job whose result the caller waits for next is *urgent*: it runs
before every lane's.

Each job submitted hands the pool one call that runs one job, the one picked when the call
starts, so every job runs, and at most as many at once as the pool has threads. A job's future
is cancelled like any other, and a cancelled job is skipped. :class:`Lanes` is itself an
:class:`~concurrent.futures.Executor` whose :meth:`~Lanes.submit` jobs are urgent, so a load's
file writes (:mod:`.file_writes`) share it and are not queued behind the lanes.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

_Job = tuple[Future[Any], Callable[[], Any], object]


class Lanes(Executor):
    """Runs jobs on ``pool`` (the caller's to shut down), urgent ones first, then by lane."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._urgent: deque[_Job] = deque()
        self._lanes: dict[object, deque[_Job]] = {}  # in the order they opened: oldest first
        self._running: dict[object, int] = {}

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` as an urgent job."""
        return self.submit_to(None, functools.partial(fn, *args, **kwargs))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Cancel the jobs not started, if asked; the pool is the caller's to shut down."""
        if cancel_futures:
            with self._lock:
                queued = [*self._urgent, *(job for queue in self._lanes.values() for job in queue)]
            for future, _, _ in queued:
                future.cancel()

    def submit_to(self, lane: object, job: Callable[[], T]) -> Future[T]:
        """Run ``job`` after the jobs of ``lane`` (any hashable object) submitted before it, or,
        when ``lane`` is ``None``, before any lane's job, after the urgent ones submitted
        before it."""
        future: Future[T] = Future()
        with self._lock:
            queue = self._urgent if lane is None else self._lanes.setdefault(lane, deque())
            queue.append((future, job, lane))
        self._pool.submit(self._run_one)
        return future

    def _run_one(self) -> None:
        with self._lock:
            future, job, lane = self._pick()
            self._running[lane] = self._running.get(lane, 0) + 1
        try:
            if future.set_running_or_notify_cancel():
                try:
                    result = job()
                except BaseException as exc:  # the waiter gets it, as from an executor's future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
        finally:
            with self._lock:
                self._running[lane] -= 1
                if not self._running[lane]:
                    del self._running[lane]

    def _pick(self) -> _Job:
        if self._urgent:
            return self._urgent.popleft()
        lane = next((lane for lane in self._lanes if lane not in self._running), None)
        if lane is None:
            lane = next(iter(self._lanes))
        queue = self._lanes[lane]
        picked = queue.popleft()
        if not queue:
            del self._lanes[lane]
        return picked
