"""Snapshots of background saves: true to the moment they were taken, typed errors, no leftovers."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointPermissionError,
    CheckpointStorageError,
    InputChangedError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.lockfiles import SNAPSHOT_PREFIX
from tests.conftest import tree_of
from tests.single.saving.faults import before_packing, fail_to_open, restore, stalled_checkpoint

REPO = Path(__file__).resolve().parents[3]


def snapshots_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith(SNAPSHOT_PREFIX))


# -- shared writable memory maps ----------------------------------------------------------------


def test_a_file_written_through_a_shared_memory_map_is_saved_as_it_was_at_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "step").write_text("1")
    weights = np.memmap(model / "weights.f32", dtype=np.float32, mode="w+", shape=(1 << 16,))
    weights[:] = 1.0  # every page dirty: later writes to them do not move the mtime
    cp, gate = stalled_checkpoint(tmp_path / "obj", monkeypatch)
    cp.save_sync(model, background=True)
    weights[:] = 2.0  # the next training step, written while the upload waits
    (model / "step.tmp").write_text("2")
    os.replace(model / "step.tmp", model / "step")
    gate.set()
    cp.wait_sync()
    restored = restore(tmp_path / "obj")
    assert (restored / "step").read_text() == "1"
    assert set(np.fromfile(restored / "weights.f32", dtype=np.float32)) == {1.0}
    del weights


MAPPER = textwrap.dedent(
    """
    import mmap, sys
    with open(sys.argv[1], "r+b") as file:
        view = mmap.mmap(file.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    for line in sys.stdin:
        view[:] = line.strip().encode() * (len(view) // len(line.strip()))
        print("written", flush=True)
    """
)


def test_a_file_another_process_writes_through_a_shared_map_is_saved_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "shard").write_bytes(b"0" * (1 << 16))
    writer = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(model / "shard")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None
    assert writer.stdout is not None
    try:
        writer.stdin.write("a\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"
        cp, gate = stalled_checkpoint(tmp_path / "obj", monkeypatch)
        cp.save_sync(model, background=True)
        writer.stdin.write("b\n")
        writer.stdin.flush()
        assert writer.stdout.readline() == "written\n"
        gate.set()
        cp.wait_sync()
    finally:
        writer.stdin.close()
        writer.wait(10)
    assert (restore(tmp_path / "obj") / "shard").read_bytes() == b"a" * (1 << 16)


# -- snapshots of killed saves ------------------------------------------------------------------

KILLED_SAVE = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from flyte_checkpoint import Checkpoint

    cp = Checkpoint(sys.argv[2])
    held = threading.Event()

    def never_write(*args, **kwargs):
        print("uploading", flush=True)
        held.wait()

    cp._dest_backend.open_write = never_write
    cp.save_sync(Path(sys.argv[1]), background=True)
    """
)


@pytest.fixture
def other_filesystem_tmpdir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A TMPDIR on another filesystem than ``tmp_path``: snapshots then sit beside the source."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == tmp_path.stat().st_dev:
        pytest.fail("this test needs /dev/shm on a filesystem other than the test's tmp_path")
    temp = Path(tempfile.mkdtemp(dir="/dev/shm"))
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    yield temp
    subprocess.run(["rm", "-rf", str(temp)], check=True)


def kill_a_background_save_of(source: Path, tmp_path: Path) -> None:
    """Run a background save of ``source`` in another process and SIGKILL it mid-upload."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVE, str(source), str(tmp_path / "killed-obj")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == "uploading\n"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        process.stdout.close()


def test_a_snapshot_left_by_a_killed_save_is_swept_by_the_next_background_save(
    tmp_path: Path, model_dir: Path, other_filesystem_tmpdir: Path
) -> None:
    kill_a_background_save_of(model_dir, tmp_path)
    assert snapshots_in(model_dir.parent)  # what the killed save left behind
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(model_dir, background=True)
    cp.wait_sync()
    assert snapshots_in(model_dir.parent) == []
    assert tree_of(restore(tmp_path / "obj")) == tree_of(model_dir)


def test_a_snapshot_left_beside_a_file_is_not_packed_by_a_later_save_of_its_directory(
    tmp_path: Path, model_dir: Path, other_filesystem_tmpdir: Path
) -> None:
    expected = tree_of(model_dir)
    kill_a_background_save_of(model_dir / "weights.bin", tmp_path)
    assert snapshots_in(model_dir)
    Checkpoint(str(tmp_path / "obj")).save_sync(model_dir)
    assert tree_of(restore(tmp_path / "obj")) == expected


def test_a_directory_of_the_users_that_only_looks_like_a_snapshot_is_saved(
    tmp_path: Path, model_dir: Path
) -> None:
    (model_dir / f"{SNAPSHOT_PREFIX}mine").mkdir()
    (model_dir / f"{SNAPSHOT_PREFIX}mine" / "data").write_text("user data")
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(model_dir, background=True)
    cp.wait_sync()
    assert tree_of(restore(tmp_path / "obj")) == tree_of(model_dir)


# -- errors name the caller's paths -------------------------------------------------------------


def deeper_than_path_max(root: Path) -> Path:
    """A directory tree whose deepest path is longer than PATH_MAX (made relative to fds)."""
    name = "d" * 250
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(20):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    return root


@pytest.mark.parametrize("background", [True, False])
def test_a_tree_deeper_than_path_max_is_refused_naming_the_callers_directory(
    tmp_path: Path, background: bool
) -> None:
    deep = deeper_than_path_max(tmp_path / "deep")
    cp = Checkpoint(str(tmp_path / "obj"))
    with pytest.raises(InvalidCheckpointInputError, match="PATH_MAX") as raised:
        cp.save_sync(deep, background=background)  # a background save walks it for its snapshot
    assert str(deep) in str(raised.value)
    assert SNAPSHOT_PREFIX not in str(raised.value)


@pytest.mark.parametrize(
    ("error", "typed"), [(errno.EACCES, CheckpointPermissionError), (errno.EMFILE, CheckpointStorageError)]
)
def test_a_file_that_cannot_be_read_during_a_background_save_is_named_as_the_callers(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, error: int, typed: type[CheckpointError]
) -> None:
    fail_to_open(monkeypatch, "weights.bin", error)
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(model_dir, background=True)
    with pytest.raises(typed) as raised:
        cp.wait_sync()
    assert str(model_dir / "weights.bin") in str(raised.value)
    assert SNAPSHOT_PREFIX not in str(raised.value)


def test_a_file_shortened_in_place_during_a_background_save_fails_it_as_changed(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def the_trainer_truncates_it(path: str) -> None:
        os.truncate(path, 1000)  # the writer's stat already says 300 000 bytes

    before_packing(monkeypatch, "weights.bin", the_trainer_truncates_it)
    cp = Checkpoint(str(tmp_path / "obj"))
    cp.save_sync(model_dir, background=True)
    with pytest.raises(InputChangedError, match=r"weights\.bin was modified in place"):
        cp.wait_sync()
    assert not (tmp_path / "obj").exists()
