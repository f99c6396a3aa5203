"""``flyte-checkpoint get --force`` replaces a directory all or nothing; a failed get leaves no folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointCorruptError, CheckpointError
from flyte_checkpoint.single.inspection import restore_to
from tests.conftest import damage_in_place, tree_of


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    (source / "shards").mkdir(parents=True)
    (source / "weights.bin").write_bytes(b"new weights")
    (source / "shards" / "rank0.bin").write_bytes(b"new shard")
    Checkpoint(tmp_path / "obj").save_sync(source)
    return tmp_path / "obj"


@pytest.fixture
def target(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)
    (out / "weights.bin").write_bytes(b"old weights")
    (out / "shards" / "old.bin").write_bytes(b"old shard")
    (out / "notes.txt").write_text("mine")
    (out / "logs").mkdir()
    (out / "logs" / "run.log").write_text("kept")
    return out


def fail_rename(monkeypatch: pytest.MonkeyPatch, target: Path, failing_call: int) -> None:
    """Make the ``failing_call``-th rename that moves something into, out of or beside ``target``
    fail, as an I/O error would; renames inside the archive being extracted are not counted."""
    calls: list[str] = []
    real_rename, real_replace = os.rename, os.replace
    watched = {target, target.parent}

    def faulty(real: Any) -> Any:
        def move(source: Any, destination: Any) -> None:
            if {Path(source).parent, Path(destination).parent} & watched:
                calls.append(str(source))
                if len(calls) == failing_call:
                    raise OSError(5, "Input/output error (injected)", str(source))
            real(source, destination)

        return move

    monkeypatch.setattr("os.rename", faulty(real_rename))
    monkeypatch.setattr("os.replace", faulty(real_replace))


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".flyte-cp-"))


def test_a_forced_get_replaces_same_named_entries_and_keeps_the_others(
    checkpoint: Path, target: Path
) -> None:
    restore_to(str(checkpoint), target, force=True)
    assert tree_of(target) == {
        "weights.bin": b"new weights",
        "shards": None,
        "shards/rank0.bin": b"new shard",
        "notes.txt": b"mine",
        "logs": None,
        "logs/run.log": b"kept",
    }
    assert leftovers(target.parent) == []


@pytest.mark.parametrize("failing_call", [1, 2, 3, 4])
def test_a_forced_get_failing_at_any_rename_leaves_the_directory_as_it_was(
    checkpoint: Path, target: Path, monkeypatch: pytest.MonkeyPatch, failing_call: int
) -> None:
    before = tree_of(target)
    fail_rename(monkeypatch, target, failing_call)
    with pytest.raises(CheckpointError, match="injected"):
        restore_to(str(checkpoint), target, force=True)
    assert tree_of(target) == before
    assert leftovers(target.parent) == []


def test_a_forced_get_of_a_damaged_object_leaves_the_directory_as_it_was(
    checkpoint: Path, target: Path
) -> None:
    damage_in_place(checkpoint, 40, b"\xff\x00\xff")
    before = tree_of(target)
    with pytest.raises(CheckpointCorruptError):
        restore_to(str(checkpoint), target, force=True)
    assert tree_of(target) == before


def test_a_failed_get_into_a_new_folder_removes_the_folders_it_made(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_rename(monkeypatch, tmp_path / "new" / "deeper" / "out", 1)
    with pytest.raises(CheckpointError, match="injected"):
        restore_to(str(checkpoint), tmp_path / "new" / "deeper" / "out")
    assert not (tmp_path / "new").exists()


def test_a_get_into_a_new_folder_makes_it_with_the_usual_mode(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    restore_to(str(checkpoint), tmp_path / "out-new")
    assert (tmp_path / "out-new").stat().st_mode == (tmp_path / "probe").stat().st_mode


def test_a_forced_get_keeps_the_directory_mode(checkpoint: Path, target: Path) -> None:
    target.chmod(0o750)
    restore_to(str(checkpoint), target, force=True)
    assert target.stat().st_mode & 0o777 == 0o750
