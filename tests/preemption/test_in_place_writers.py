"""A task that rewrites its state file in place (``torch.save(state, same_path)``) while a
background save of it is in flight loses that one save, never the task: the next save goes on,
and copies the file from then on so the same rewrite cannot discard it again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, InputChangedError
from flyte_checkpoint.single.saving import snapshot
from tests.preemption.test_final_save_supersedes import HeldUpload

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def nothing_learnt_yet() -> None:
    snapshot._rewritten_in_place.clear()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory holding 4 MiB of weights, ``weights.bin``."""
    path = tmp_path / "state"
    path.mkdir()
    (path / "weights.bin").write_bytes(os.urandom(4 * MiB))
    return path


def rewrite_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as file:  # the same inode, truncated and rewritten
        file.truncate(0)
        file.write(data)


def saved_while_rewritten(
    helper: Checkpoint, state: Path, data: bytes, also: dict[str, bytes] | None = None
) -> None:
    """A background save of ``state``, held in flight while ``weights.bin`` (and each file named
    in ``also``) is rewritten in place."""
    held = HeldUpload()
    helper.save_sync(state, background=True, progress=held)
    assert held.underway.wait(30)
    rewrite_in_place(state / "weights.bin", data)
    for name, content in (also or {}).items():
        rewrite_in_place(state / name, content)
    held.release.set()


def restored_weights(tmp_path: Path) -> bytes:
    with Checkpoint(tmp_path / "reader", tmp_path / "ckpt") as reader:
        restored = reader.load_sync()
        assert restored is not None
        return (restored / "weights.bin").read_bytes()


def test_the_save_after_an_in_place_rewrite_goes_on_instead_of_raising(tmp_path: Path, state: Path) -> None:
    newer = os.urandom(4 * MiB)
    with Checkpoint(tmp_path / "ckpt") as helper:
        saved_while_rewritten(helper, state, newer)
        while helper._saves._uploading():  # the discarded save has failed before the next one
            time.sleep(0.005)
        helper.save_sync(state, background=True)  # used to raise the InputChangedError
        helper.wait_sync()
    assert restored_weights(tmp_path) == newer


def test_a_file_rewritten_in_place_once_is_copied_by_later_snapshots(tmp_path: Path, state: Path) -> None:
    with Checkpoint(tmp_path / "ckpt") as helper:
        saved_while_rewritten(helper, state, os.urandom(4 * MiB))
        with pytest.raises(InputChangedError):
            helper.wait_sync()  # no newer save: the discarded one is still reported
        stored = (state / "weights.bin").read_bytes()
        saved_while_rewritten(helper, state, os.urandom(4 * MiB))  # the snapshot copied it
        helper.wait_sync()
    assert restored_weights(tmp_path) == stored


def test_every_file_rewritten_in_place_during_one_discarded_save_is_copied_by_later_snapshots(
    tmp_path: Path, state: Path
) -> None:
    (state / "meta.json").write_bytes(b'{"step": 1}')
    with Checkpoint(tmp_path / "ckpt") as helper:
        saved_while_rewritten(helper, state, os.urandom(4 * MiB), {"meta.json": b'{"step": 2}'})  # one step
        with pytest.raises(InputChangedError, match=r"and 1 other files"):
            helper.wait_sync()
        weights = (state / "weights.bin").read_bytes()
        saved_while_rewritten(helper, state, os.urandom(4 * MiB), {"meta.json": b'{"step": 3}'})  # the next
        helper.wait_sync()  # used to be discarded again for meta.json: one file learnt per discard
    assert restored_weights(tmp_path) == weights


def test_a_committed_background_save_reports_its_staging_apart_from_its_upload(
    tmp_path: Path, state: Path
) -> None:
    with Checkpoint(tmp_path / "ckpt") as helper:
        assert helper.last_save is None
        helper.save_sync(state, background=True)
        helper.wait_sync()
        linked = helper.last_save
        saved_while_rewritten(helper, state, os.urandom(4 * MiB))
        with pytest.raises(InputChangedError):
            helper.wait_sync()
        helper.save_sync(state, background=True)  # the snapshot copies the learnt file
        helper.wait_sync()
        copied = helper.last_save
    assert linked is not None
    assert linked.background
    assert linked.copied_bytes == 0
    assert 0 <= linked.staged_seconds <= linked.durable_seconds
    assert copied is not None
    assert copied.copied_bytes == 4 * MiB


def test_a_committed_blocking_save_reports_the_whole_save_as_staging(tmp_path: Path) -> None:
    with Checkpoint(tmp_path / "ckpt") as helper:
        helper.save_sync(b"state")
        times = helper.last_save
    assert times is not None
    assert not times.background
    assert times.staged_seconds == times.durable_seconds
