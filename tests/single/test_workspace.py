"""Workspaces: removed on close and swept when abandoned, never touching anything outside them."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint.single.workspace import Workspace, sweep_abandoned_workspaces


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR of the test's own, world-writable and sticky like ``/tmp``."""
    temp = tmp_path / "tmpdir"
    temp.mkdir()
    temp.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_closing_a_workspace_that_was_moved_away_leaves_tmpdir_permissions_alone(
    private_tmpdir: Path, tmp_path: Path
) -> None:
    workspace = Workspace()
    directory = Path(str(workspace.path))
    shutil.move(directory, tmp_path / "moved")
    workspace.close()
    assert mode_of(private_tmpdir) == 0o1777


def test_a_planted_lock_file_without_a_workspace_leaves_tmpdir_permissions_alone(
    private_tmpdir: Path,
) -> None:
    (private_tmpdir / "flyte-cp-planted.lock").touch()
    assert Workspace().path.is_dir()  # creating a workspace sweeps abandoned ones first
    assert mode_of(private_tmpdir) == 0o1777


def test_a_planted_lock_beside_a_symlink_is_not_followed(private_tmpdir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    (private_tmpdir / "flyte-cp-planted").symlink_to(victim)
    (private_tmpdir / "flyte-cp-planted.lock").touch()
    assert sweep_abandoned_workspaces() == 0
    assert (victim / "precious").read_text() == "keep me"
    assert mode_of(private_tmpdir) == 0o1777
    assert mode_of(victim) == 0o755


def test_a_lock_file_that_is_a_symlink_is_not_followed(private_tmpdir: Path, tmp_path: Path) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("not a lock")
    (private_tmpdir / "flyte-cp-planted").mkdir()
    (private_tmpdir / "flyte-cp-planted.lock").symlink_to(decoy)
    assert sweep_abandoned_workspaces() == 0
    assert (private_tmpdir / "flyte-cp-planted").is_dir()
    assert decoy.read_text() == "not a lock"


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's files needs chown")
def test_a_workspace_of_another_user_is_left_alone(private_tmpdir: Path) -> None:
    theirs = private_tmpdir / "flyte-cp-theirs"
    theirs.mkdir()
    (theirs / "data").write_text("theirs")
    lock = private_tmpdir / "flyte-cp-theirs.lock"
    lock.touch()
    for path in (theirs, theirs / "data", lock):
        os.chown(path, 65534, 65534)
    assert sweep_abandoned_workspaces() == 0
    assert (theirs / "data").read_text() == "theirs"


def test_an_abandoned_workspace_of_ours_is_swept(private_tmpdir: Path) -> None:
    ours = private_tmpdir / "flyte-cp-abandoned"
    (ours / "nested").mkdir(parents=True)
    (ours / "nested" / "file").write_text("x")
    (ours / "nested").chmod(0o500)  # the task made it read-only
    (private_tmpdir / "flyte-cp-abandoned.lock").touch()
    assert sweep_abandoned_workspaces() == 1
    assert not ours.exists()
    assert mode_of(private_tmpdir) == 0o1777


def test_a_live_workspace_is_not_swept(private_tmpdir: Path) -> None:
    workspace = Workspace()
    directory = Path(str(workspace.path))
    assert sweep_abandoned_workspaces() == 0
    assert directory.is_dir()
    workspace.close()
    assert not directory.exists()


def test_running_out_of_file_descriptors_at_close_leaves_tmpdir_permissions_alone(
    private_tmpdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = Workspace()
    directory = str(workspace.path)
    real_open = os.open

    def out_of_descriptors(path: Any, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == directory:  # fault injection: EMFILE when removal opens the tree
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", out_of_descriptors)
    workspace.close()
    monkeypatch.undo()
    assert mode_of(private_tmpdir) == 0o1777
