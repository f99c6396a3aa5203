"""What the checkpoint helper does once a preemption notice arrived: the one-line loop's API,
saves bounded by the time left, and waits that end at the save deadline."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import Preempted, PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from tests.single.saving.faults import failing_uploads, stall_uploads
from tests.storage_servers import StorageServer, create_bucket

MiB = 1 << 20


def slow_directory(root: Path, files: int = 24) -> Path:
    root.mkdir()
    for index in range(files):
        (root / f"shard-{index}.bin").write_bytes(os.urandom(MiB))
    return root


def crawl(done: int, total: int | None) -> None:
    """A progress callback that makes a save slow: 30 ms per MiB."""
    time.sleep(0.03)


def stalled_upload_in_flight(
    target: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> tuple[Checkpoint, threading.Event]:
    """A helper with a background save of ``data`` under way and held at its start by the gate."""
    helper = Checkpoint(target)
    gate = threading.Event()
    started = stall_uploads(monkeypatch, helper._dest_backend, gate)
    helper.save_sync(data, background=True)
    give_up = time.monotonic() + 20
    while not started and time.monotonic() < give_up:
        time.sleep(0.01)
    assert started, "the background upload never started"
    return helper, gate


def test_preempted_is_false_and_time_left_none_before_a_notice(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    assert helper.preempted is False
    assert helper.time_left() is None


def test_preempted_is_true_and_time_left_counts_down_after_a_notice(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    notice.notify_signal(signal.SIGTERM, 30.0)
    assert helper.preempted is True
    left = helper.time_left()
    assert left is not None
    assert 29.0 < left <= 30.0


def test_reading_preempted_tells_the_handler_the_task_handles_the_notice(tmp_path: Path) -> None:
    assert not notice.taken_over()
    _ = Checkpoint(tmp_path / "ckpt").preempted
    assert notice.taken_over()


def test_preemption_is_a_system_exit_with_the_signals_status_saying_the_save_committed(
    tmp_path: Path,
) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    helper.save_sync(b"step 10")
    notice.notify_signal(signal.SIGTERM, 30.0)
    helper.save_sync(b"step 11")
    preempted = helper.preemption()
    assert isinstance(preempted, SystemExit)
    assert not isinstance(preempted, Exception)
    assert preempted.code == 143
    assert preempted.saved is True
    assert "committed to" in str(preempted)
    assert "SIGTERM" in str(preempted)


def test_preemption_says_when_no_save_committed_after_the_notice(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    helper.save_sync(b"step 10")
    notice.notify_signal(signal.SIGUSR1, 30.0)
    preempted = helper.preemption()
    assert preempted.saved is False
    assert preempted.code == 128 + signal.SIGUSR1
    assert "no save" in str(preempted)


def test_preemption_waits_for_the_background_save_sent_as_the_notice_came_and_says_it_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The documented loop, when the notice arrives while the state is written: that step's save
    # went to the background, and the loop raises checkpoint.preemption() right after.
    helper, gate = stalled_upload_in_flight(tmp_path / "ckpt", monkeypatch, b"step 20")
    notice.notify_signal(signal.SIGTERM, 30.0)
    threading.Timer(0.3, gate.set).start()
    preempted = helper.preemption()
    assert preempted.saved is True
    assert "committed to" in str(preempted)
    assert (tmp_path / "ckpt").read_bytes() == b"step 20"


def test_preemption_stops_waiting_for_a_background_save_at_the_save_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper, gate = stalled_upload_in_flight(tmp_path / "ckpt", monkeypatch, b"step 20")
    notice.notify_signal(signal.SIGTERM, 0.5)  # the save deadline 0.45 s away
    try:
        started = time.monotonic()
        preempted = helper.preemption()
        waited = time.monotonic() - started
    finally:
        gate.set()
    assert preempted.saved is False
    assert "did not commit before the save deadline" in str(preempted)
    assert waited < 5


def test_preemption_names_the_failure_of_the_background_save_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    failing_uploads(monkeypatch, helper)
    helper.save_sync(b"step 20", background=True)
    notice.notify_signal(signal.SIGTERM, 30.0)
    preempted = helper.preemption()
    assert preempted.saved is False
    assert "in flight failed: injected upload failure" in str(preempted)


def test_preemption_without_a_notice_is_a_mistake_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"check checkpoint\.preempted first"):
        Checkpoint(tmp_path / "ckpt").preemption()


def test_a_preempted_exception_survives_pickling(tmp_path: Path) -> None:
    import pickle

    notice.notify_signal(signal.SIGTERM, 30.0)
    copy = pickle.loads(pickle.dumps(Checkpoint(tmp_path / "ckpt").preemption()))
    assert isinstance(copy, Preempted)
    assert copy.code == 143
    assert copy.saved is False


def test_a_save_estimated_not_to_fit_is_not_started_while_an_older_one_is_in_flight_which_commits(
    tmp_path: Path,
) -> None:
    target = tmp_path / "ckpt"
    helper = Checkpoint(target)
    source = slow_directory(tmp_path / "state")
    helper.save_sync(source, progress=crawl)  # measured: about a second
    release = threading.Event()

    def held(done: int, total: int | None) -> None:
        assert release.wait(30), "the test never released the upload"

    helper.save_sync(b"in flight", background=True, progress=held)
    notice.notify_signal(signal.SIGTERM, 0.5)  # 0.45 s to the save deadline
    try:
        with pytest.raises(PreemptionDeadlineError, match=r"estimated at .* in flight is given the time"):
            helper.save_sync(source)
    finally:
        release.set()
    helper.wait_sync()
    assert target.read_bytes() == b"in flight"


def test_a_save_estimated_not_to_fit_is_tried_when_nothing_is_in_flight(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    helper = Checkpoint(target)
    helper.save_sync(slow_directory(tmp_path / "state"), progress=crawl)  # measured: about a second
    notice.notify_signal(signal.SIGTERM, 0.5)  # 0.45 s to the save deadline
    small = tmp_path / "small"
    small.mkdir()
    (small / "step").write_bytes(b"11")
    helper.save_sync(small)  # the estimate leans long; refusing could only lose this state
    with Checkpoint(tmp_path / "unused", target) as reader:
        restored = reader.load_sync()
        assert restored is not None
        assert (restored / "step").read_bytes() == b"11"


def test_a_save_after_a_notice_that_runs_past_the_deadline_is_stopped_and_the_old_object_stays(
    tmp_path: Path,
) -> None:
    target = tmp_path / "ckpt"
    helper = Checkpoint(target)
    helper.save_sync(b"previous")
    notice.notify_signal(signal.SIGTERM, 0.5)  # never measured a directory save: it is tried
    with pytest.raises(PreemptionDeadlineError, match="save deadline of the SIGTERM preemption notice"):
        helper.save_sync(slow_directory(tmp_path / "state"), progress=crawl)
    assert target.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt")] == []


def test_a_save_to_s3_after_a_notice_is_bounded_by_the_time_left(
    tmp_path: Path, s3_server: StorageServer
) -> None:
    uri = f"s3://{create_bucket(s3_server)}/ckpt"
    helper = Checkpoint(uri, storage_options=s3_server.storage_options)
    helper.save_sync(b"previous")
    notice.notify_signal(signal.SIGTERM, 0.5)
    with pytest.raises(PreemptionDeadlineError):
        helper.save_sync(slow_directory(tmp_path / "state", files=40), progress=crawl)
    notice.clear()
    with Checkpoint(tmp_path / "unused", uri, storage_options=s3_server.storage_options) as reader:
        restored = reader.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"previous"


def test_waiting_for_a_background_save_ends_at_the_save_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper, gate = stalled_upload_in_flight(tmp_path / "ckpt", monkeypatch, b"in flight")
    notice.notify_signal(signal.SIGTERM, 1.0)  # after the upload started: it is not bounded
    try:
        with pytest.raises(PreemptionDeadlineError, match="did not commit before the save deadline"):
            helper.wait_sync()
    finally:
        gate.set()
    notice.clear()
    helper.wait_sync()
    assert (tmp_path / "ckpt").read_bytes() == b"in flight"


def test_saves_in_flight_are_counted_for_the_handlers_watcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gate = stalled_upload_in_flight(tmp_path / "ckpt", monkeypatch, b"in flight")
    assert not notice.wait_for_saves(time.monotonic() + 0.2)
    threading.Timer(0.1, gate.set).start()
    assert notice.wait_for_saves(time.monotonic() + 20)
    assert notice.saves_in_flight() == 0
