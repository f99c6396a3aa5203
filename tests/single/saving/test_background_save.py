"""Background saves: return after a snapshot, upload in a worker, isolate later writes, surface failures."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointPermissionError,
    CheckpointStorageError,
    InputChangedError,
    ctx,
    run_with_retries,
)
from flyte_checkpoint import archive as archive_module
from flyte_checkpoint.lockfiles import SNAPSHOT_PREFIX
from flyte_checkpoint.single.saving.background import BackgroundSaver
from flyte_checkpoint.single.saving.job import SaveJob
from flyte_checkpoint.single.saving.snapshot import Snapshot
from flyte_checkpoint.storage import backend_for
from flyte_checkpoint.storage.base import WriteGate
from tests.conftest import tree_of
from tests.single.saving.faults import failing_uploads, restore, stall_uploads, stalled_checkpoint


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``TMPDIR`` of the test's own, where background saves take their snapshots."""
    directory = tmp_path / "tmpdir"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def test_a_background_save_returns_before_the_upload_and_lands_after_wait(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp, gate = stalled_checkpoint(target, monkeypatch)
    cp.save_sync(model_dir, background=True)
    assert not target.exists()
    gate.set()
    cp.wait_sync()
    assert tree_of(restore(target)) == tree_of(model_dir)


def test_files_replaced_or_added_after_the_snapshot_do_not_leak_into_the_object(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = tree_of(model_dir)
    cp = Checkpoint(str(tmp_path / "obj"))
    gate = threading.Event()
    stall_uploads(monkeypatch, cp._dest_backend, gate)
    cp.save_sync(model_dir, background=True)
    replacement = model_dir / "weights.bin.tmp"
    replacement.write_bytes(b"new weights")
    os.replace(replacement, model_dir / "weights.bin")
    (model_dir / "config.json").unlink()
    (model_dir / "added-later.txt").write_text("late")
    gate.set()
    cp.wait_sync()
    assert tree_of(restore(tmp_path / "obj")) == expected


def test_a_file_overwritten_in_place_during_upload_fails_that_save_and_keeps_the_old_object(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    cp.save_sync(b"old checkpoint")
    original_pack = archive_module.pack_directory

    def pack_while_training_writes(source: Path, sink: Any, *, level: int) -> None:
        with open(model_dir / "weights.bin", "r+b") as weights:  # the trainer rewrites in place
            weights.write(b"CHANGED")
        original_pack(source, sink, level=level)

    monkeypatch.setattr(archive_module, "pack_directory", pack_while_training_writes)
    cp.save_sync(model_dir, background=True)
    with pytest.raises(InputChangedError, match=r"weights\.bin was modified in place"):
        cp.wait_sync()
    assert target.read_bytes() == b"old checkpoint"


def held_in_flight(
    target: Path, monkeypatch: pytest.MonkeyPatch, first: bytes
) -> tuple[Checkpoint, threading.Event, list[str]]:
    """A helper saving to ``target`` whose background save of ``first`` is in flight, held at
    the returned gate (as every later upload is), and the uploads started so far."""
    cp = Checkpoint(str(target))
    gate = threading.Event()
    started = stall_uploads(monkeypatch, cp._dest_backend, gate)
    cp.save_sync(first, background=True)
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.001)
    return cp, gate, started


def test_a_newer_background_save_supersedes_the_queued_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp, gate, started = held_in_flight(target, monkeypatch, b"step 0")
    for step in range(1, 5):
        cp.save_sync(f"step {step}".encode(), background=True)
    gate.set()
    cp.wait_sync()
    assert target.read_bytes() == b"step 4"
    assert cp._saves.superseded == 3
    assert len(started) == 2


def test_a_background_failure_is_raised_by_the_next_save(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    cp = Checkpoint(str(tmp_path / "a-directory"))
    cp.save_sync(b"cannot land", background=True)
    with pytest.raises(CheckpointStorageError, match="is a directory"):
        cp.save_sync(b"next")


def test_a_background_failure_is_raised_by_close(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    cp = Checkpoint(str(tmp_path / "a-directory"))
    cp.save_sync(b"cannot land", background=True)
    workspace = Path(str(cp.path))
    with pytest.raises(CheckpointStorageError):
        cp.close()
    assert not workspace.exists()


def test_a_blocking_save_lands_after_earlier_background_saves(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    cp.save_sync(os.urandom(1 << 20), background=True)
    cp.save_sync(b"final")
    assert target.read_bytes() == b"final"


def test_snapshots_are_removed_after_the_upload(tmp_path: Path, model_dir: Path) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(model_dir, background=True)
    cp.wait_sync()
    leftovers = [p for p in model_dir.parent.iterdir() if p.name.startswith(".flyte-cp-snapshot-")]
    assert leftovers == []


def test_a_background_save_of_a_missing_path_fails_at_once(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Checkpoint(str(tmp_path / "obj")).save_sync(tmp_path / "missing", background=True)


def test_the_retry_runner_flushes_background_saves_before_an_attempt_ends(tmp_path: Path) -> None:
    def task() -> None:
        context = ctx()
        assert context is not None
        assert context.checkpoint is not None
        context.checkpoint.save_sync(os.urandom(4 << 20), background=True)

    run_with_retries(task, retries=0, checkpoint_dir=tmp_path)
    assert (tmp_path / "checkpoint").stat().st_size == 4 << 20


async def test_an_async_background_save_returns_before_the_upload_and_wait_flushes_it(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp, gate = stalled_checkpoint(target, monkeypatch)
    await cp.save(model_dir, background=True)  # returns although the upload cannot write yet
    assert not target.exists()
    gate.set()
    await cp.wait()
    assert tree_of(restore(target)) == tree_of(model_dir)


def test_an_upload_in_flight_holds_its_writes_while_the_caller_takes_the_next_snapshot(
    tmp_path: Path,
) -> None:
    target = str(tmp_path / "obj")
    writing, wrote = threading.Event(), threading.Event()

    def upload(job: SaveJob, gate: WriteGate) -> None:
        writer = backend_for(target).open_write(target, {}, gate=gate)
        writing.set()
        writer.write(b"data")
        wrote.set()
        writer.commit()

    saver = BackgroundSaver(upload, target)
    with saver.paused():
        saver.submit(SaveJob(Snapshot(b"data"), ticket=1))
        assert writing.wait(5)
        assert not wrote.wait(0.3), "the write should wait for the snapshot to be taken"
    assert wrote.wait(5)
    saver.wait()
    assert Path(target).read_bytes() == b"data"


def test_a_superseded_save_that_failed_is_logged_not_raised_once_a_newer_save_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    backend = cp._dest_backend
    original = backend.open_write
    in_flight, release = threading.Event(), threading.Event()

    def first_upload_fails(uri: str, metadata: Any, **declared: Any) -> Any:
        if not in_flight.is_set():  # fault injection: the store refuses the first upload
            in_flight.set()
            assert release.wait(30), "test gate never opened"
            raise CheckpointStorageError("injected: the store refused step 1")
        return original(uri, metadata, **declared)

    monkeypatch.setattr(backend, "open_write", first_upload_fails)
    cp.save_sync(b"step 1", background=True)
    assert in_flight.wait(30)
    cp.save_sync(b"step 2", background=True)  # queued behind the failing upload
    release.set()
    with caplog.at_level(logging.WARNING, logger="flyte_checkpoint"):
        cp.wait_sync()
    assert target.read_bytes() == b"step 2"
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "injected: the store refused step 1" in caplog.records[0].getMessage()


def test_the_newest_failure_is_raised_when_every_save_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    backend = cp._dest_backend
    in_flight, release = threading.Event(), threading.Event()
    attempts: list[str] = []

    def every_upload_fails(uri: str, metadata: Any, **declared: Any) -> Any:
        attempts.append(uri)
        in_flight.set()
        assert release.wait(30), "test gate never opened"
        raise CheckpointStorageError(f"injected failure {len(attempts)}")

    monkeypatch.setattr(backend, "open_write", every_upload_fails)
    cp.save_sync(b"step 1", background=True)
    assert in_flight.wait(30)
    cp.save_sync(b"step 2", background=True)
    release.set()
    with pytest.raises(CheckpointStorageError, match="injected failure 2"):
        cp.wait_sync()


def test_the_info_line_of_a_background_save_names_the_callers_directory(
    tmp_path: Path, model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    with caplog.at_level(logging.INFO, logger="flyte_checkpoint"):
        cp.save_sync(model_dir, background=True)
        cp.wait_sync()
    (saved,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("saved")]
    assert f"directory {model_dir}:" in saved
    assert ".flyte-cp-snapshot-" not in saved


def save_then_fail(cp: Checkpoint) -> None:
    with cp:
        cp.save_sync(b"step 1", background=True)
        raise KeyError("the task's own error")


def test_the_tasks_own_error_leaves_a_with_block_with_the_background_failure_attached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    failing_uploads(monkeypatch, cp)
    with pytest.raises(KeyError, match="the task's own error") as raised:
        save_then_fail(cp)
    assert any("injected upload failure" in note for note in getattr(raised.value, "__notes__", []))


async def test_the_tasks_own_error_leaves_an_async_with_block_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    failing_uploads(monkeypatch, cp)

    async def task() -> None:
        async with cp:
            await cp.save(b"step 1", background=True)
            raise KeyError("the task's own error")

    with pytest.raises(KeyError, match="the task's own error"):
        await task()


def test_a_background_failure_still_leaves_a_with_block_that_ended_normally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    failing_uploads(monkeypatch, cp)
    with pytest.raises(CheckpointStorageError, match="injected upload failure"), cp:
        cp.save_sync(b"step 1", background=True)


def a_tree_with_every_kind_of_entry(root: Path) -> Path:
    (root / "sub" / "empty").mkdir(parents=True)
    (root / "sub" / "weights.bin").write_bytes(b"w" * 1000)
    (root / "to-weights").symlink_to("sub/weights.bin")
    os.chmod(root / "sub", 0o550)  # read-only: a snapshot fills it before it takes this mode
    os.utime(root / "sub", (1_000_000_000, 1_000_000_000))
    return root


def test_a_background_save_keeps_directories_links_and_modes_as_they_were_at_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = a_tree_with_every_kind_of_entry(tmp_path / "model")
    target = tmp_path / "obj"
    cp, gate, _ = held_in_flight(target, monkeypatch, b"step 0")
    cp.save_sync(source, background=True)  # queued: its snapshot's tree is made after step 0
    os.chmod(source / "sub", 0o755)
    (source / "sub" / "late.txt").write_text("late")
    (source / "to-weights").unlink()
    (source / "sub" / "empty").rmdir()
    gate.set()
    cp.wait_sync()
    restored = restore(target)
    assert sorted(p.relative_to(restored).as_posix() for p in restored.rglob("*")) == [
        "sub",
        "sub/empty",
        "sub/weights.bin",
        "to-weights",
    ]
    assert os.readlink(restored / "to-weights") == "sub/weights.bin"
    assert (restored / "sub").stat().st_mode & 0o777 == 0o750  # a load adds u+w (see extract)
    assert (restored / "sub").stat().st_mtime == 1_000_000_000


def test_a_background_saves_caller_makes_no_directory_per_directory_of_the_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model"
    deep = source.joinpath(*(f"level-{n}" for n in range(12)))
    deep.mkdir(parents=True)
    (deep / "weights.bin").write_bytes(b"w" * 1000)
    made_by_the_caller: list[str] = []
    real_mkdir = os.mkdir
    caller = threading.get_ident()

    def counted_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == caller:
            made_by_the_caller.append(os.fsdecode(path))
        real_mkdir(path, *args, **kwargs)

    cp = Checkpoint(str(tmp_path / "obj"))
    monkeypatch.setattr(os, "mkdir", counted_mkdir)
    cp.save_sync(source, background=True)
    monkeypatch.undo()
    cp.wait_sync()
    assert len(made_by_the_caller) <= 2, made_by_the_caller  # the snapshot's own, and its staging
    assert tree_of(restore(tmp_path / "obj")) == tree_of(source)


def test_a_snapshot_whose_directories_cannot_be_made_fails_its_save_naming_the_callers_directory(
    tmp_path: Path, scratch: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    cp.save_sync(b"old checkpoint")
    real_mkdir = os.mkdir
    caller = threading.get_ident()

    def full_in_the_worker(path: Any, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() != caller:  # fault injection: TMPDIR fills after the links
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", full_in_the_worker)
    cp.save_sync(model_dir, background=True)
    with pytest.raises(CheckpointStorageError, match="out of space") as raised:
        cp.wait_sync()
    assert str(model_dir) in str(raised.value)
    assert target.read_bytes() == b"old checkpoint"
    assert list(scratch.iterdir()) == []  # the snapshot and its lock file are gone


def test_a_ctrl_c_while_a_newer_save_replaces_the_queued_one_still_uploads_the_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp, gate, _ = held_in_flight(target, monkeypatch, b"step 1")
    cp.save_sync(b"step 2", background=True)  # queued
    real_discard = Snapshot.discard

    def interrupted_discard(snapshot: Snapshot) -> None:
        monkeypatch.setattr(Snapshot, "discard", real_discard)
        raise KeyboardInterrupt  # fault injection: Ctrl-C lands while step 2 is being dropped

    monkeypatch.setattr(Snapshot, "discard", interrupted_discard)
    with pytest.raises(KeyboardInterrupt):
        cp.save_sync(b"step 3", background=True)
    gate.set()
    cp.wait_sync()
    assert target.read_bytes() == b"step 3"


def test_a_ctrl_c_inside_starting_the_upload_thread_leaves_one_upload_that_wait_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    gate = threading.Event()
    stall_uploads(monkeypatch, cp._dest_backend, gate)
    real_start = threading.Thread.start
    upload_threads: list[threading.Thread] = []

    def interrupted_start(thread: threading.Thread) -> None:
        real_start(thread)
        if thread.name.startswith("flyte-checkpoint-save"):
            upload_threads.append(thread)
            if len(upload_threads) == 1:  # fault injection: Ctrl-C lands as the thread starts
                raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        cp.save_sync(b"step 1", background=True)
    cp.save_sync(b"step 2", background=True)
    waiter = threading.Thread(target=cp.wait_sync)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # wait_sync() waits for the upload held at the gate
    gate.set()
    waiter.join(30)
    assert target.read_bytes() == b"step 2"
    assert len(upload_threads) == 1


def test_an_unreadable_directory_fails_a_background_save_at_once_without_copying_anything(
    tmp_path: Path, scratch: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (model_dir / "locked").mkdir()
    real_scandir = os.scandir

    def unreadable(path: Any = ".") -> Any:
        if os.fspath(path).endswith(f"{os.sep}locked"):  # fault injection: root reads every directory
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", unreadable)
    copied: list[str] = []
    real_copy = shutil.copy2

    def recorded_copy(source: Any, target: Any, **kwargs: Any) -> Any:
        copied.append(os.fspath(source))
        return real_copy(source, target, **kwargs)

    monkeypatch.setattr(shutil, "copy2", recorded_copy)
    cp = Checkpoint(str(tmp_path / "obj"))
    with pytest.raises(CheckpointPermissionError, match="locked"):
        cp.save_sync(model_dir, background=True)
    assert copied == []  # not taken for a filesystem without hard links
    assert list(scratch.iterdir()) == []
    assert [p.name for p in model_dir.parent.iterdir() if p.name.startswith(SNAPSHOT_PREFIX)] == []


def test_a_background_save_of_the_working_directory_as_dot_is_saved_whole(
    tmp_path: Path, scratch: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(model_dir)
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(Path("."), background=True)
    cp.wait_sync()
    assert tree_of(restore(tmp_path / "obj")) == tree_of(model_dir)
    assert list(scratch.iterdir()) == []
