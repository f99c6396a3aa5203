"""State saves and loads stage components in scratch directories under TMPDIR: none outlives
the operation, and one left by a process killed in the middle is removed by the next."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flyte_checkpoint import lockfiles
from flyte_checkpoint.state import load_checkpoint, save_checkpoint
from tests.state.workers import Controller, Unit

LEAVE_A_SCRATCH_AND_DIE = """
import os, sys
from pathlib import Path
from flyte_checkpoint.lockfiles import make_locked_directory
directory, _ = make_locked_directory(Path(sys.argv[1]), "flyte-cp-state-")
(directory / "part-0").write_bytes(b"captured")
print(directory, flush=True)
os._exit(0)  # as a SIGKILL would: no cleanup runs
"""

HOLD_A_SCRATCH = """
import sys
from pathlib import Path
from flyte_checkpoint.lockfiles import make_locked_directory
directory, _ = make_locked_directory(Path(sys.argv[1]), "flyte-cp-state-")
print(directory, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    temp = tmp_path / "tmpdir"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def save_and_load(checkpoint_dir: Path) -> None:
    save_checkpoint(str(checkpoint_dir), controller=Controller({1}, step=1), parts=[Unit({1: "one"})])
    load_checkpoint(str(checkpoint_dir), controller=Controller(), parts=[Unit()])


def test_a_save_and_a_load_leave_nothing_in_tmpdir(private_tmpdir: Path, tmp_path: Path) -> None:
    save_and_load(tmp_path / "ckpt")
    assert list(private_tmpdir.iterdir()) == []


def test_the_scratch_of_a_killed_process_is_removed_by_the_next_save(
    private_tmpdir: Path, tmp_path: Path
) -> None:
    left = subprocess.run(
        [sys.executable, "-c", LEAVE_A_SCRATCH_AND_DIE, str(private_tmpdir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(left).is_dir()
    save_and_load(tmp_path / "ckpt")
    assert list(private_tmpdir.iterdir()) == []


def test_the_scratch_of_a_live_process_is_left_alone(private_tmpdir: Path, tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_A_SCRATCH, str(private_tmpdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        held = Path(holder.stdout.readline().strip())
        try:
            save_and_load(tmp_path / "ckpt")
            assert held.is_dir()
        finally:
            holder.stdin.close()
            holder.wait(timeout=60)


def test_a_scratch_whose_lock_file_cannot_be_made_is_not_left_behind(
    private_tmpdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(path: Path, mode: int = 0o600) -> int | None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(lockfiles, "create_locked", no_space)
    with pytest.raises(OSError, match="No space left"):
        save_and_load(tmp_path / "ckpt")
    assert list(private_tmpdir.iterdir()) == []


DIE_RIGHT_AFTER_MAKING_THE_DIRECTORY = """
import os, sys
from pathlib import Path
from flyte_checkpoint.lockfiles import make_locked_directory
real_mkdir = os.mkdir
def mkdir_then_die(path, *args, **kwargs):
    real_mkdir(path, *args, **kwargs)
    if os.path.basename(path).startswith("flyte-cp-state-"):
        os._exit(9)  # as a SIGKILL landing right after the mkdir would: no cleanup runs
os.mkdir = mkdir_then_die
make_locked_directory(Path(sys.argv[1]), "flyte-cp-state-")
"""


def test_a_process_killed_right_after_making_its_scratch_leaves_nothing_the_next_save_keeps(
    private_tmpdir: Path, tmp_path: Path
) -> None:
    died = subprocess.run(
        [sys.executable, "-c", DIE_RIGHT_AFTER_MAKING_THE_DIRECTORY, str(private_tmpdir)], timeout=60
    )
    assert died.returncode == 9
    assert list(private_tmpdir.iterdir())  # it left its directory
    save_and_load(tmp_path / "ckpt")
    assert list(private_tmpdir.iterdir()) == []


def an_old_lockless_scratch(parent: Path, name: str) -> Path:
    directory = parent / name
    directory.mkdir()
    old = time.time() - 2 * lockfiles.LOCKLESS_AGE
    os.utime(directory, (old, old))
    return directory


def test_an_old_empty_scratch_without_a_lock_is_removed_by_the_next_save(
    private_tmpdir: Path, tmp_path: Path
) -> None:
    an_old_lockless_scratch(private_tmpdir, "flyte-cp-state-left1234")  # as earlier versions left them
    save_and_load(tmp_path / "ckpt")
    assert list(private_tmpdir.iterdir()) == []


def test_a_directory_without_a_lock_that_is_young_holds_files_or_is_named_otherwise_is_left_alone(
    private_tmpdir: Path, tmp_path: Path
) -> None:
    young = private_tmpdir / "flyte-cp-state-young123"
    young.mkdir()  # an earlier version's process may be about to lock it
    holding = an_old_lockless_scratch(private_tmpdir, "flyte-cp-state-full1234")
    (holding / "part-0").write_bytes(b"not ours to judge")
    os.utime(holding, (time.time() - 1000, time.time() - 1000))
    another_tools = an_old_lockless_scratch(private_tmpdir, "flyte-cp-state-output")
    save_and_load(tmp_path / "ckpt")
    assert sorted(p.name for p in private_tmpdir.iterdir()) == sorted(
        [holding.name, young.name, another_tools.name]
    )
