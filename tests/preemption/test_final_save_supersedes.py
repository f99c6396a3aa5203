"""After a notice, the final save goes first: it never waits for the older background save in
flight, and that older save can never commit over it."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.single.saving.order import CommitOrder, SupersededError
from flyte_checkpoint.storage.stores.local import temp_files_for
from tests.preemption.test_checkpoint_after_a_notice import slow_directory
from tests.storage_servers import StorageServer, create_bucket

STATE_FILES = 8


class HeldUpload:
    """A progress callback that holds a background upload after its first bytes until released."""

    def __init__(self) -> None:
        self.underway = threading.Event()
        self.release = threading.Event()

    def __call__(self, done: int, total: int | None) -> None:
        self.underway.set()
        assert self.release.wait(30), "the test never released the held upload"


def background_save_held_in_flight(helper: Checkpoint, state: Path) -> HeldUpload:
    held = HeldUpload()
    helper.save_sync(state, background=True, progress=held)
    assert held.underway.wait(30), "the background upload never started"
    return held


def stored(helper: Checkpoint, tmp_path: Path) -> bytes:
    with Checkpoint(
        tmp_path / "reader-unused", helper.remote_destination, storage_options=helper._storage_options
    ) as reader:
        restored = reader.load_sync()
        assert restored is not None
        assert restored.is_file()
        return restored.read_bytes()


def test_the_final_save_after_a_notice_commits_while_the_background_save_is_still_in_flight(
    tmp_path: Path,
) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    held = background_save_held_in_flight(helper, slow_directory(tmp_path / "state", files=STATE_FILES))
    notice.notify_signal(signal.SIGTERM, 5.0)
    try:
        helper.save_sync(b"final state")  # waiting for the held upload would end in PreemptionDeadlineError
        assert (tmp_path / "ckpt").read_bytes() == b"final state"
    finally:
        held.release.set()
    helper.close()


def test_the_older_background_save_never_commits_over_the_final_save(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    held = background_save_held_in_flight(helper, slow_directory(tmp_path / "state", files=STATE_FILES))
    notice.notify_signal(signal.SIGTERM, 5.0)
    helper.save_sync(b"final state")
    held.release.set()
    helper.wait_sync()  # the superseded save is discarded, not failed
    assert (tmp_path / "ckpt").read_bytes() == b"final state"
    assert temp_files_for(tmp_path / "ckpt") == []  # the older upload was aborted, not left behind


def test_a_queued_background_save_is_dropped_by_the_final_save(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    held = background_save_held_in_flight(helper, slow_directory(tmp_path / "state", files=STATE_FILES))
    helper.save_sync(b"queued state", background=True)
    notice.notify_signal(signal.SIGTERM, 5.0)
    helper.save_sync(b"final state")
    held.release.set()
    helper.wait_sync()
    assert (tmp_path / "ckpt").read_bytes() == b"final state"


def test_the_background_save_in_flight_goes_on_when_the_final_save_is_refused(tmp_path: Path) -> None:
    helper = Checkpoint(tmp_path / "ckpt")
    held = background_save_held_in_flight(helper, slow_directory(tmp_path / "state", files=STATE_FILES))
    notice.notify_signal(signal.SIGTERM, 0.01)
    time.sleep(0.05)  # past the save deadline: the final save is not started
    with pytest.raises(PreemptionDeadlineError, match="not saving"):
        helper.save_sync(b"final state")
    held.release.set()
    notice.clear()
    helper.wait_sync()
    restored = Checkpoint(tmp_path / "unused", tmp_path / "ckpt").load_sync()
    assert restored is not None
    assert restored.is_dir()
    assert sorted(p.name for p in restored.iterdir()) == [
        f"shard-{index}.bin" for index in range(STATE_FILES)
    ]


def test_the_final_save_supersedes_the_background_upload_in_flight_on_s3(
    tmp_path: Path, s3_server: StorageServer
) -> None:
    uri = f"s3://{create_bucket(s3_server)}/ckpt"
    helper = Checkpoint(uri, storage_options=s3_server.storage_options)
    held = background_save_held_in_flight(helper, slow_directory(tmp_path / "state", files=STATE_FILES))
    notice.notify_signal(signal.SIGTERM, 10.0)
    try:
        helper.save_sync(b"final state")
    finally:
        held.release.set()
    helper.wait_sync()
    notice.clear()
    assert stored(helper, tmp_path) == b"final state"


def test_a_save_whose_ticket_is_older_than_a_committed_one_is_refused_its_commit() -> None:
    order = CommitOrder()
    older, newer = order.ticket(), order.ticket()
    with order.turn(newer, "file:///ckpt"):
        pass
    with pytest.raises(SupersededError, match="newer save"), order.turn(older, "file:///ckpt"):
        pytest.fail("the older save was let commit")


def test_a_save_that_fails_its_commit_does_not_supersede_older_ones() -> None:
    order = CommitOrder()
    older, newer = order.ticket(), order.ticket()
    with pytest.raises(OSError, match="refused"), order.turn(newer, "file:///ckpt"):
        raise OSError("the store refused the commit")
    with order.turn(older, "file:///ckpt"):
        pass
    assert not order.superseded(older)
