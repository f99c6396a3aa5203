"""A task that takes the upload over after a notice (``checkpoint.hold_background_save()``) holds
the older background upload in flight, so the final state is written and saved without it taking
the cores and the disk; the hold ends with the next save, a wait, ``preemption()``, or after half
the time left. Reading ``checkpoint.preempted`` alone leaves the upload as it was."""

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


def assert_commits_unheld(target: Path) -> float:
    """Poll for the upload in flight to commit to ``target`` within 3 s (a hold lasts 1.8 s or more
    in these tests); when it did."""
    asked_at = time.monotonic()
    committed = committed_by(target, asked_at + 10)
    assert committed is not None, "the upload never committed"
    assert committed - asked_at < 3
    return committed


def test_reading_preempted_after_a_notice_leaves_the_background_upload_going(tmp_path: Path) -> None:
    helper, recorder = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)  # a hold would last 13.5 s
    assert helper.preempted
    assert helper.preempted
    read_at = time.monotonic()
    committed = assert_commits_unheld(tmp_path / "ckpt")
    assert recorder.writes_between(read_at, committed)
    helper.close()


def test_holding_the_background_save_after_a_notice_holds_the_upload_until_the_final_save(
    tmp_path: Path,
) -> None:
    helper, recorder = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.preempted
    helper.hold_background_save()
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
    helper.hold_background_save()
    read_at = time.monotonic()
    committed = committed_by(tmp_path / "ckpt", read_at + 10)
    assert committed is not None, "the held upload never committed"
    assert committed - read_at > 1.5
    assert recorder.writes_between(read_at + 0.15, read_at + 1.5) == []
    helper.close()


def test_the_upload_is_held_once_per_notice_however_often_the_hold_is_asked_for(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 4.0)
    helper.hold_background_save()
    time.sleep(1.9)  # the hold (1.8 s) is over
    helper.hold_background_save()
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
    helper.hold_background_save()
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
    helper.hold_background_save()
    started = time.monotonic()
    preempted = helper.preemption()
    assert preempted.saved is True
    assert time.monotonic() - started < 5
    helper.close()


def test_wait_sync_ends_the_hold(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    helper.hold_background_save()
    started = time.monotonic()
    helper.wait_sync()
    assert time.monotonic() - started < 5
    assert (tmp_path / "ckpt").exists()
    helper.close()


def test_time_left_does_not_hold_the_background_upload(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.time_left() is not None
    assert_commits_unheld(tmp_path / "ckpt")
    helper.close()


def test_holding_the_background_save_before_a_notice_does_nothing(tmp_path: Path) -> None:
    helper, _ = background_save_underway(tmp_path)
    helper.hold_background_save()
    assert_commits_unheld(tmp_path / "ckpt")
    helper.close()


def test_holding_the_background_save_tells_the_handler_the_task_handles_the_notice(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert not notice.taken_over()
    helper.hold_background_save()
    assert notice.taken_over()
