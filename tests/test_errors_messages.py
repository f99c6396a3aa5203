"""Error messages say what happened once, in the words of what was being done."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointPermissionError,
    CheckpointStorageError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.cli import EXIT_CORRUPT, main
from flyte_checkpoint.errors import describe_error
from flyte_checkpoint.storage.errors import os_error_to_checkpoint_error
from flyte_checkpoint.storage.stores import local as local_store
from tests.conftest import damage_in_place

DENIED = PermissionError(errno.EACCES, "Permission denied")


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    Checkpoint(target).save_sync(b"checkpoint bytes" * 64)
    damage_in_place(target, 3, b"#")
    return target


def test_a_damaged_checkpoint_is_called_damaged_once_when_loaded(damaged: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointCorruptError) as raised:
        Checkpoint(tmp_path / "unused", damaged).load_sync()
    message = describe_error(raised.value)
    assert str(damaged) in message
    assert message.replace(str(damaged), "CKPT").count("damaged") == 1, message


def test_a_damaged_checkpoint_is_called_damaged_once_by_verify(
    damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "-q", str(damaged)]) == EXIT_CORRUPT
    err = capsys.readouterr().err.replace(str(damaged), "CKPT")
    assert err.count("damaged") == 1, err


@pytest.mark.parametrize("action", ["reading", "loading", "inspecting"])
def test_a_refused_read_asks_for_read_permission_not_a_place_to_write(action: str) -> None:
    error = os_error_to_checkpoint_error(
        PermissionError(errno.EACCES, "Permission denied"), "/x/ckpt", action
    )
    assert "may read it" in str(error)
    assert "write" not in str(error)


def test_a_refused_save_still_asks_for_a_place_to_write() -> None:
    error = os_error_to_checkpoint_error(
        PermissionError(errno.EACCES, "Permission denied"), "/x/ckpt", "saving"
    )
    assert "may write there" in str(error)


def test_a_load_refused_by_permissions_asks_for_read_permission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ckpt"
    Checkpoint(target).save_sync(b"state")

    def refuse(*args: Any, **kwargs: Any) -> Any:  # root reads everything: injected
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(local_store, "open", refuse, raising=False)
    with pytest.raises(CheckpointPermissionError, match="may read it") as raised:
        Checkpoint(tmp_path / "unused", target).load_sync()
    assert "write" not in str(raised.value)


def test_saving_under_a_symlink_to_nothing_names_the_link_not_a_file(tmp_path: Path) -> None:
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(CheckpointStorageError) as raised:
        Checkpoint(link / "job" / "ckpt").save_sync(b"state")
    message = str(raised.value)
    assert f"{link} is a symbolic link to '{tmp_path / 'gone'}', which does not exist" in message
    assert "is a file" not in message


def test_saving_under_a_real_file_still_says_a_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(CheckpointStorageError, match="a parent of it is a file"):
        Checkpoint(tmp_path / "runs" / "job" / "ckpt").save_sync(b"state")


def test_a_link_to_an_absolute_path_outside_is_called_absolute_not_climbing(tmp_path: Path) -> None:
    source = tmp_path / "model"
    source.mkdir()
    (source / "weights").write_bytes(b"w")
    os.symlink("/etc/passwd", source / "passwd")
    with pytest.raises(InvalidCheckpointInputError) as raised:
        Checkpoint(tmp_path / "ckpt").save_sync(source)
    assert "'/etc/passwd', an absolute path outside the directory being saved" in str(raised.value)
    assert "climbs" not in str(raised.value)
