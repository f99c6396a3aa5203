"""A task taking a notice over (reading ``checkpoint.preempted``) holds the older background
upload in flight, so the final state is written and saved without it taking the cores and the
disk; the hold ends with the next save, a wait, ``preemption()``, or after half the time left."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from tests.preemption.test_checkpoint_after_a_notice import slow_directory

STATE_FILES = 8


class Recorder:
    """A progress callback that records when the upload writes, 30 ms a call (a slow upload)."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self.underway = threading.Event()

    def __call__(self, done: int, total: int | None) -> None:
        self.calls.append(time.monotonic())
        self.underway.set()
        time.sleep(0.03)

    def writes_between(self, start: float, end: float) -> list[float]:
        return [moment for moment in self.calls if start <= moment <= end]


def background_save_underway(tmp_path: Path) -> tuple[Checkpoint, Recorder]:
    helper = Checkpoint(tmp_path / "ckpt")
    recorder = Recorder()
    state = slow_directory(tmp_path / "state", files=STATE_FILES)
    helper.save_sync(state, background=True, progress=recorder)
    assert recorder.underway.wait(30), "the background upload never started"
    return helper, recorder


def committed_by(target: Path, give_up: float) -> float | None:
    """When ``target`` appeared (polled, no wait on the helper), or ``None`` by ``give_up``."""
    while time.monotonic() < give_up:
        if target.exists():
            return time.monotonic()
        time.sleep(0.01)
    return None


def test_reading_preempted_after_a_notice_holds_the_background_upload_until_the_final_save(
    tmp_path: Path,
) -> None:
    helper, recorder = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.preempted
    read_at = time.monotonic()
    time.sleep(0.6)
    assert recorder.writes_between(read_at + 0.15, read_at + 0.6) == []
    helper.save_sync(b"final state")
    helper.wait_sync()
    assert (tmp_path / "ckpt").read_bytes() == b"final state"


def test_the_held_upload_resumes_and_commits_when_no_save_comes_in_half_the_time_left(
    tmp_path: Path,
) -> None:
    helper, recorder = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 4.0)  # save deadline 3.6 s away: held for 1.8 s
    assert helper.preempted
    read_at = time.monotonic()
    committed = committed_by(tmp_path / "ckpt", read_at + 10)
    assert committed is not None, "the held upload never committed"
    assert committed - read_at > 1.5
    assert recorder.writes_between(read_at + 0.15, read_at + 1.5) == []
    helper.close()


def test_the_upload_is_held_once_per_notice_however_often_preempted_is_read(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 4.0)
    assert helper.preempted
    time.sleep(1.9)  # the hold (1.8 s) is over
    assert helper.preempted
    second_read = time.monotonic()
    committed = committed_by(tmp_path / "ckpt", second_read + 10)
    assert committed is not None, "the upload never committed"
    assert committed - second_read < 0.7  # not held again for half of the 1.7 s left
    helper.close()


def test_a_final_save_refused_as_not_fitting_lets_the_held_upload_go_on_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)  # held for up to 13.5 s
    assert helper.preempted
    # Fault injection: this helper's past saves say a save takes 100 s.
    monkeypatch.setattr(helper._saves.durations, "estimate", lambda content: (100.0, "a test's estimate"))
    with pytest.raises(PreemptionDeadlineError, match="a test's estimate"):
        helper.save_sync(b"final state")
    refused_at = time.monotonic()
    committed = committed_by(tmp_path / "ckpt", refused_at + 20)
    assert committed is not None, "the held upload never committed"
    assert committed - refused_at < 5


def test_preemption_ends_the_hold_and_reports_the_held_upload_committed(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)  # held for up to 13.5 s
    assert helper.preempted
    started = time.monotonic()
    preempted = helper.preemption()
    assert preempted.saved is True
    assert time.monotonic() - started < 5
    helper.close()


def test_wait_sync_ends_the_hold(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.preempted
    started = time.monotonic()
    helper.wait_sync()
    assert time.monotonic() - started < 5
    assert (tmp_path / "ckpt").exists()
    helper.close()


def test_time_left_does_not_hold_the_background_upload(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.time_left() is not None
    read_at = time.monotonic()
    committed = committed_by(tmp_path / "ckpt", read_at + 10)
    assert committed is not None
    assert committed - read_at < 3
    helper.close()
