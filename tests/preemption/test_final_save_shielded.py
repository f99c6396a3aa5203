"""The final save after a notice is not cut short by an exception another signal handler raises
in the main thread meanwhile (a DataLoader's SIGCHLD handler, once its fork workers died of the
same group SIGTERM): the save commits, then that exception is raised."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.preemption import notice


class WorkerDied(RuntimeError):
    """What torch's DataLoader raises from its SIGCHLD handler when a worker was killed."""


@pytest.fixture
def raising_sigusr1() -> Iterator[None]:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise WorkerDied("DataLoader worker (pid 1234) is killed by signal: Terminated.")

    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)
        notice.clear()


class SignalMidSave:
    """A progress callback that sends SIGUSR1 to this process once the save has begun writing,
    then lets the save go on a little longer, so the signal's handler runs while it is writing."""

    def __init__(self) -> None:
        self.sent = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)
            threading.Event().wait(0.3)


def restored(tmp_path: Path) -> bytes:
    with Checkpoint(tmp_path / "reader", tmp_path / "ckpt") as reader:
        loaded = reader.load_sync()
        assert loaded is not None
        return loaded.read_bytes()


@pytest.mark.usefixtures("raising_sigusr1")
def test_the_final_save_commits_before_an_exception_a_signal_handler_raised_during_it(tmp_path: Path) -> None:
    state = os.urandom(8 * 1024 * 1024)
    helper = Checkpoint(tmp_path / "ckpt")
    helper.save_sync(b"older state")
    notice.notify_signal(signal.SIGTERM, 30.0)
    progress = SignalMidSave()
    with pytest.raises(WorkerDied):
        helper.save_sync(state, progress=progress)
    assert progress.sent
    assert restored(tmp_path) == state  # used to be the older state: the save was cut short
    helper.close()


@pytest.mark.usefixtures("raising_sigusr1")
def test_before_a_notice_a_signal_handlers_exception_still_stops_a_save_where_it_is(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    helper.save_sync(b"older state")
    with pytest.raises(WorkerDied):
        helper.save_sync(os.urandom(8 * 1024 * 1024), progress=SignalMidSave())
    assert restored(tmp_path) == b"older state"
    helper.close()


@pytest.mark.usefixtures("raising_sigusr1")
def test_the_final_save_commits_when_the_handlers_exception_lands_before_its_thread_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a loaded machine the new thread can run the save, and the signal its progress sends
    # can reach the main thread, while the main thread is still inside Thread.start().
    progress = SignalMidSave()
    real_start = threading.Thread.start

    def start_returning_after_the_signal(thread: threading.Thread) -> None:
        real_start(thread)
        if thread.name.startswith("flyte-checkpoint-final-save"):
            while not progress.sent:
                threading.Event().wait(0.001)  # the handler's exception is raised in here

    monkeypatch.setattr(threading.Thread, "start", start_returning_after_the_signal)
    state = os.urandom(8 * 1024 * 1024)
    helper = Checkpoint(tmp_path / "ckpt")
    helper.save_sync(b"older state")
    notice.notify_signal(signal.SIGTERM, 30.0)
    with pytest.raises(WorkerDied):
        helper.save_sync(state, progress=progress)
    assert restored(tmp_path) == state
    helper.close()
