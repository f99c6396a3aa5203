"""A load's pool of threads, whose jobs are picked so that its threads write different files at once.

The kernel lets one write into a file at a time (the inode's lock), so two threads that load
consecutive members of one file take turns at its writes; measured here on 2 cores, reading,
checking and writing 1 GiB of weights went 1.6x faster on two threads than on one when both
wrote the same file, 1.9x when each wrote its own. So a load's jobs go into *lanes*, one per
file whose data they write: a free thread takes the next job of the oldest lane no other thread
is working on (of the oldest lane, when every lane has a thread), and within a lane the jobs
run in the order they came. A job whose result the caller waits for next is *urgent*: it runs
before every lane's.

:class:`Lanes` is an :class:`~concurrent.futures.Executor` with threads of its own, whose
:meth:`~Lanes.submit` jobs are urgent, so a load's file writes (:mod:`.file_writes`) share it
and are not queued behind the lanes. Its threads take the next job themselves, where a job
handed through a :class:`~concurrent.futures.ThreadPoolExecutor` cost the submitting thread a
second future and work item: about a quarter of the extracting thread's CPU. A job's
future is cancelled like any other, and a cancelled job is skipped.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

_Job = tuple[Future[Any], Callable[[], Any], object]


class Lanes(Executor):
    """``threads`` threads named ``{thread_name_prefix}_{n}`` that run jobs, urgent ones first,
    then by lane. :meth:`shutdown` ends them (the threads are daemons, so a pool never shut
    down cannot keep the interpreter from exiting)."""

    def __init__(self, threads: int, thread_name_prefix: str) -> None:
        # The jobs are kept under a plain lock; a thread waits for one on a queue of wake-ups,
        # one per job, both made in C: Ctrl-C lands on the submitting thread, and a Python-level
        # condition interrupted half-way through a notify could leave a thread asleep or the
        # lock held for good.
        self._lock = threading.Lock()
        self._wake_ups: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._urgent: deque[_Job] = deque()
        self._lanes: dict[object, deque[_Job]] = {}  # in the order they opened: oldest first
        self._running: dict[object, int] = {}
        self._closed = False
        self._threads: list[threading.Thread] = []
        try:
            for number in range(threads):
                thread = threading.Thread(
                    target=self._work, name=f"{thread_name_prefix}_{number}", daemon=True
                )
                self._threads.append(thread)  # before it starts: shutdown() then waits for it
                thread.start()
        except BaseException:  # Ctrl-C among the starts: end those started, or they wait forever
            self.shutdown()
            raise

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` as an urgent job."""
        return self.submit_to(None, functools.partial(fn, *args, **kwargs))

    def submit_to(self, lane: object, job: Callable[[], T]) -> Future[T]:
        """Run ``job`` after the jobs of ``lane`` (any hashable object) submitted before it, or,
        when ``lane`` is ``None``, before any lane's job, after the urgent ones submitted
        before it."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new jobs after shutdown")
            jobs = self._urgent if lane is None else self._lanes.setdefault(lane, deque())
            jobs.append((future, job, lane))
        self._wake_ups.put(None)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; cancel those not started if ``cancel_futures`` (else they still
        run); with ``wait``, return once the threads have ended."""
        with self._lock:
            self._closed = True
            if cancel_futures:
                queued = [*self._urgent, *(job for jobs in self._lanes.values() for job in jobs)]
                self._urgent.clear()
                self._lanes.clear()
            else:
                queued = []
        for future, _, _ in queued:
            future.cancel()
        for _ in self._threads:
            self._wake_ups.put(None)  # after every job's: a thread that finds no job then ends
        if wait:
            self._join()

    def _join(self) -> None:
        """Wait for every thread to end, even through Ctrl-C (raised once they have: a thread
        ends within its job, and one left running would outlive the load it was part of)."""
        interrupted: BaseException | None = None
        for thread in self._threads:
            while thread.is_alive() and thread is not threading.current_thread():
                try:
                    thread.join()
                except KeyboardInterrupt as exc:
                    interrupted = exc
        if interrupted is not None:
            raise interrupted

    def _work(self) -> None:
        while True:
            self._wake_ups.get()
            with self._lock:
                # Each job's wake-up is put after the job, so a thread finds none only after
                # shutdown: at one of its wake-ups, or one of a job it cancelled.
                if not self._urgent and not self._lanes:
                    return
                future, job, lane = self._pick()
                self._running[lane] = self._running.get(lane, 0) + 1
            try:
                _run(future, job)
            finally:
                with self._lock:
                    self._running[lane] -= 1
                    if not self._running[lane]:
                        del self._running[lane]
            del future, job  # nothing of the job's is kept while the thread waits for the next

    def _pick(self) -> _Job:
        if self._urgent:
            return self._urgent.popleft()
        lane = next((lane for lane in self._lanes if lane not in self._running), None)
        if lane is None:
            lane = next(iter(self._lanes))
        jobs = self._lanes[lane]
        picked = jobs.popleft()
        if not jobs:
            del self._lanes[lane]
        return picked


def _run(future: Future[T], job: Callable[[], T]) -> None:
    """Run ``job`` for ``future``, unless it was cancelled. (Its own frame, so that what the job
    returned, a MiB or two, is not kept alive by the thread until its next job.)"""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = job()
    except BaseException as exc:  # the waiter gets it, as from an executor's future
        future.set_exception(exc)
    else:
        future.set_result(result)
