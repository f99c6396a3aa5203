"""The overall bound of object-store operations, on a real event loop in its own thread.

The end-to-end cases (a server that stops answering) are in ``test_hangs.py``; these pin down
how several operations share one loop's watchdog: which bound fires when, and how often the
caller's thread has to wake the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flyte_checkpoint.errors import CheckpointTimeoutError
from flyte_checkpoint.storage import deadline as deadline_module
from flyte_checkpoint.storage.deadline import TransferBound

LONG = 60.0


class CountingLoop(asyncio.SelectorEventLoop):
    """A loop that counts the calls other threads make into it."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups = 0

    def call_soon_threadsafe(  # type: ignore[override]  # the stub's TypeVarTuple form, loosened
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        self.wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop() -> Iterator[CountingLoop]:
    loop = CountingLoop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _sleep_long() -> None:
    await asyncio.sleep(LONG)


async def _nothing() -> None:
    return None


def _deadline(loop: asyncio.AbstractEventLoop, seconds: float | None) -> TransferBound:
    return TransferBound("s3://bucket/key", "saving", loop=loop, seconds=seconds)


def _cancelled_by_the_loop(future: concurrent.futures.Future[Any]) -> bool:
    """Whether the loop cancelled ``future``'s task (the caller never waits on it with a bound)."""
    concurrent.futures.wait([future], timeout=LONG / 2)
    return future.cancelled()


def test_a_short_bound_started_after_a_long_one_still_fires_on_time(loop: CountingLoop) -> None:
    long_bound = _deadline(loop, LONG)
    long_running = long_bound.submit(_sleep_long())
    short_bound = _deadline(loop, 1.0)
    short_running = short_bound.submit(_sleep_long())
    assert _cancelled_by_the_loop(short_running)
    assert short_bound.fired
    with pytest.raises(CheckpointTimeoutError, match="did not finish within 1 s"):
        short_bound.result(short_running)
    assert not long_bound.fired
    assert not long_running.done()
    long_running.cancel()
    long_bound.finish()


def test_operations_one_after_another_wake_the_loop_only_for_their_requests(loop: CountingLoop) -> None:
    first = _deadline(loop, LONG)
    first.result(first.submit(_nothing()))
    first.finish()
    before = loop.wakeups
    for _ in range(20):
        bound = _deadline(loop, LONG)
        bound.result(bound.submit(_nothing()))
        bound.finish()
    assert loop.wakeups - before == 20  # one per submitted request: none to arm or disarm a bound


def test_a_finished_operation_is_not_fired_when_its_bound_passes(loop: CountingLoop) -> None:
    bound = _deadline(loop, 1.0)
    bound.result(bound.submit(_nothing()))
    bound.finish()
    later = _deadline(loop, 1.5)  # its timer fires after the first bound has passed
    assert _cancelled_by_the_loop(later.submit(_sleep_long()))
    assert later.fired
    assert not bound.fired


def test_a_default_bound_that_grew_fires_at_its_new_end(
    loop: CountingLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deadline_module, "BASE_SECONDS", 1.0)
    monkeypatch.setattr(deadline_module, "SECONDS_PER_MIB", 2.0)
    bound = _deadline(loop, None)
    running = bound.submit(_sleep_long())
    bound.allow_for(1 << 20)  # now 3 s: the timer set for 1 s must not fire it
    time.sleep(1.5)
    assert not bound.fired
    assert not running.done()
    assert _cancelled_by_the_loop(running)
    assert bound.fired


def test_a_loop_that_ran_operations_is_not_kept_alive_by_its_watchdog() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    bound = _deadline(loop, LONG)
    bound.result(bound.submit(_nothing()))
    bound.finish()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()
    gone = weakref.ref(loop)
    del loop, bound, thread
    gc.collect()
    assert gone() is None


@pytest.mark.skipif(
    not hasattr(os, "fork"), reason="os.fork is POSIX-only; the reset runs only in forked children"
)
def test_a_child_forked_while_another_thread_registers_a_loop_can_still_bound_its_operations() -> None:
    holding, release = threading.Event(), threading.Event()

    def hold_the_registry() -> None:
        with deadline_module._watchdogs_lock:
            holding.set()
            release.wait(timeout=LONG)

    holder = threading.Thread(target=hold_the_registry)
    holder.start()
    holding.wait(timeout=LONG)
    child = os.fork()
    if child == 0:  # the child: the lock's holder does not exist here
        code = 1
        try:
            signal.alarm(10)  # a deadlock ends the child instead of the test run
            deadline_module._watchdog_for(asyncio.new_event_loop())
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join(timeout=10)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
