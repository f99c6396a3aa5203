"""Trees of any depth are removed: a workspace's clean-up and the sweep of abandoned ones never
raise ``RecursionError`` (``shutil.rmtree`` recursed once per level before Python 3.13)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flyte_checkpoint.single.workspace import WORKSPACE_PREFIX, Workspace, sweep_abandoned_workspaces
from flyte_checkpoint.tree_removal import remove_tree

DEEPER_THAN_THE_RECURSION_LIMIT = 1_200  # the default limit is 1,000 frames


@pytest.fixture(autouse=True)
def no_deep_tree_left(tmp_path: Path) -> Iterator[None]:
    """pytest's own clean-up of old temporary directories recurses per level: leave no deep tree."""
    yield
    for child in tmp_path.iterdir():
        if child.is_dir() and not child.is_symlink():
            remove_tree(str(child))


def make_deep_tree(top: Path, depth: int = DEEPER_THAN_THE_RECURSION_LIMIT) -> None:
    """``top/d/d/.../d/leaf``, built through descriptors (its full path is too long to name)."""
    top.mkdir()
    descriptor = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=descriptor)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = inner
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=descriptor)
        os.close(leaf)
    finally:
        os.close(descriptor)


def test_a_tree_deeper_than_the_recursion_limit_is_removed(tmp_path: Path) -> None:
    make_deep_tree(tmp_path / "deep")
    remove_tree(str(tmp_path / "deep"))
    assert not (tmp_path / "deep").exists()


def test_read_only_and_unreadable_directories_inside_the_tree_are_removed(tmp_path: Path) -> None:
    (tmp_path / "tree" / "locked" / "inner").mkdir(parents=True)
    (tmp_path / "tree" / "locked" / "inner" / "file").write_bytes(b"x")
    (tmp_path / "tree" / "locked" / "inner").chmod(stat.S_IRUSR | stat.S_IXUSR)
    (tmp_path / "tree" / "locked").chmod(0)
    remove_tree(str(tmp_path / "tree"))
    assert not (tmp_path / "tree").exists()


def test_a_symlink_inside_the_tree_is_removed_and_its_target_kept(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "kept").write_bytes(b"kept")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "link").symlink_to(tmp_path / "outside")
    remove_tree(str(tmp_path / "tree"))
    assert not (tmp_path / "tree").exists()
    assert (tmp_path / "outside" / "kept").read_bytes() == b"kept"


def test_a_missing_tree_counts_as_removed(tmp_path: Path) -> None:
    remove_tree(str(tmp_path / "never-made"))


def test_an_abandoned_workspace_holding_a_deep_tree_is_swept_without_an_error(tmp_path: Path) -> None:
    abandoned = tmp_path / f"{WORKSPACE_PREFIX}abandoned"
    make_deep_tree(abandoned)
    Path(f"{abandoned}.lock").write_bytes(b"")  # a lock file nobody holds: its owner died
    assert sweep_abandoned_workspaces(str(tmp_path)) == 1
    assert list(tmp_path.iterdir()) == []


def test_clearing_a_workspace_that_holds_a_deep_tree_empties_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    workspace = Workspace()
    make_deep_tree(Path(workspace.path) / "restored")
    workspace.clear()
    assert list(Path(workspace.path).iterdir()) == []
    workspace.close()


def test_a_symlink_given_as_the_tree_is_refused_and_nothing_removed(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "kept").write_bytes(b"kept")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(NotADirectoryError, match="symbolic link"):
        remove_tree(str(tmp_path / "link"))
    assert (tmp_path / "link").is_symlink()
    assert (tmp_path / "target" / "kept").read_bytes() == b"kept"
