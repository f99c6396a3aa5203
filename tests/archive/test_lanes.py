"""The pool's jobs run urgent ones first, then each lane's in order, a free thread preferring a
lane no other thread is working on (:mod:`flyte_checkpoint.archive.lanes`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from flyte_checkpoint.archive.lanes import Lanes

WAIT = 10.0


@pytest.fixture
def one_thread() -> Iterator[Lanes]:
    lanes = Lanes(1, "test-lanes")
    yield lanes
    lanes.shutdown(cancel_futures=True)


@pytest.fixture
def two_threads() -> Iterator[Lanes]:
    lanes = Lanes(2, "test-lanes")
    yield lanes
    lanes.shutdown(cancel_futures=True)


def held(gate: threading.Event, started: threading.Event | None = None) -> Callable[[], None]:
    def job() -> None:
        if started is not None:
            started.set()
        assert gate.wait(WAIT)

    return job


def recorded(order: list[str], name: str) -> Callable[[], str]:
    def job() -> str:
        order.append(name)
        return name

    return job


def test_urgent_jobs_run_before_the_jobs_of_any_lane(one_thread: Lanes) -> None:
    lanes, gate = one_thread, threading.Event()
    order: list[str] = []
    lanes.submit(held(gate))
    lanes.submit_to("a", recorded(order, "a1"))
    last = lanes.submit(recorded(order, "urgent"))
    gate.set()
    last.result(WAIT)
    lanes.submit(recorded(order, "end")).result(WAIT)
    assert order == ["urgent", "a1", "end"]


def test_the_jobs_of_one_lane_run_in_the_order_they_came(one_thread: Lanes) -> None:
    lanes, gate = one_thread, threading.Event()
    order: list[str] = []
    lanes.submit(held(gate))
    futures = [lanes.submit_to("a", recorded(order, f"a{n}")) for n in range(5)]
    gate.set()
    assert [future.result(WAIT) for future in futures] == ["a0", "a1", "a2", "a3", "a4"]
    assert order == ["a0", "a1", "a2", "a3", "a4"]


def test_a_free_thread_takes_a_lane_no_other_thread_is_working_on(two_threads: Lanes) -> None:
    lanes = two_threads
    order: list[str] = []
    gate_a, started_a = threading.Event(), threading.Event()
    gate_other, started_other = threading.Event(), threading.Event()
    first_of_a = lanes.submit_to("a", held(gate_a, started_a))
    other = lanes.submit(held(gate_other, started_other))
    assert started_a.wait(WAIT)
    assert started_other.wait(WAIT)  # both threads busy, one on lane a
    later_of_a = lanes.submit_to("a", recorded(order, "a2"))
    lane_b = lanes.submit_to("b", recorded(order, "b1"))
    gate_other.set()  # the thread that frees up passes over lane a, which has a thread
    assert (other.result(WAIT), lane_b.result(WAIT), later_of_a.result(WAIT)) == (None, "b1", "a2")
    assert order == ["b1", "a2"]  # lane b's job first, although lane a's came before it
    gate_a.set()
    first_of_a.result(WAIT)


def test_a_cancelled_job_never_runs(one_thread: Lanes) -> None:
    lanes, gate = one_thread, threading.Event()
    order: list[str] = []
    lanes.submit(held(gate))
    cancelled = lanes.submit_to("a", recorded(order, "cancelled"))
    assert cancelled.cancel()
    after = lanes.submit_to("a", recorded(order, "after"))
    gate.set()
    assert after.result(WAIT) == "after"
    assert order == ["after"]


def test_a_jobs_error_is_raised_by_its_future(one_thread: Lanes) -> None:
    def failing() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        one_thread.submit_to("a", failing).result(WAIT)


def test_shutting_down_with_cancel_futures_cancels_the_jobs_not_started(one_thread: Lanes) -> None:
    lanes, gate, started = one_thread, threading.Event(), threading.Event()
    order: list[str] = []
    running = lanes.submit(held(gate, started))
    assert started.wait(WAIT)
    queued = [lanes.submit_to("a", recorded(order, "a1")), lanes.submit(recorded(order, "urgent"))]
    gate.set()
    lanes.shutdown(cancel_futures=True)  # waits for the running job
    assert running.done()
    assert running.exception() is None
    assert all(future.cancelled() for future in queued)
    assert order == []


def test_a_pool_shut_down_takes_no_more_jobs_and_its_threads_end(two_threads: Lanes) -> None:
    two_threads.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        two_threads.submit(print)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("test-lanes")]


def test_jobs_left_at_shutdown_still_run_unless_cancelled(one_thread: Lanes) -> None:
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    one_thread.submit(held(gate, started))
    assert started.wait(WAIT)
    left = one_thread.submit_to("a", recorded(order, "left"))
    threading.Timer(0.05, gate.set).start()
    one_thread.shutdown()
    assert left.result(0) == "left"


def test_ctrl_c_while_shutting_down_still_waits_for_the_threads_then_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lanes, gate, started = Lanes(2, "test-lanes"), threading.Event(), threading.Event()
    lanes.submit(held(gate, started))
    assert started.wait(WAIT)
    real_join = threading.Thread.join
    interrupted: list[str] = []

    def join_interrupted_once(thread: threading.Thread, timeout: float | None = None) -> None:
        if not interrupted:  # Ctrl-C lands in the first join, while a job still runs
            interrupted.append(thread.name)
            threading.Timer(0.05, gate.set).start()
            raise KeyboardInterrupt
        real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", join_interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        lanes.shutdown()
    assert interrupted
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("test-lanes")]
