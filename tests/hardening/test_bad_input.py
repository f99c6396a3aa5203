"""Inputs a checkpoint cannot hold, and a disk that fills up, give clear typed errors.

Special files. A socket, a FIFO or a device node given to ``save`` is refused with
:class:`InvalidCheckpointInputError` (a ``ValueError``) naming what it is, before anything is
opened (so a FIFO cannot block the save) and before the previous checkpoint is touched.

Symbolic links, as ``save`` of a directory treats them:

* a directory given as a symbolic link is followed: the directory it points to is saved;
* links inside the tree whose target stays inside it are stored as links (an absolute target is
  stored relative, so the restored tree points at itself);
* a link whose target leaves the tree is refused when saving, with a message naming the link,
  because it could not be restored safely.

Full disk. A child process (``python -m tests.faults.crash.workers save --fsize-limit``) ignores
``SIGXFSZ`` and sets ``RLIMIT_FSIZE`` below the size of what it saves, so its writes fail with
``EFBIG`` as on a full disk: the save raises :class:`CheckpointStorageError` saying "out of
space", the previous checkpoint stays byte-identical and no temp file is left beside it.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.storage.stores.local import temp_files_for
from tests.conftest import tree_of
from tests.single.saving.faults import fail_to_open

REPO_ROOT = Path(__file__).resolve().parents[2]
OLD_CHECKPOINT = b"the previous, good checkpoint\n" * 1000

BACKGROUND = [pytest.param(False, id="blocking"), pytest.param(True, id="background")]


def _save(dest: Path, data: Path, *, background: bool) -> None:
    with Checkpoint(str(dest)) as checkpoint:
        checkpoint.save_sync(data, background=background)
        checkpoint.wait_sync()


def _load(dest: Path) -> dict[str, bytes | None]:
    with Checkpoint("unused-destination", str(dest)) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        return tree_of(restored)


# -- special files ----------------------------------------------------------------------------


@pytest.fixture
def socket_file() -> Iterator[Path]:
    """A listening Unix socket in a short directory (a socket path must fit in 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="fc-") as directory:
        path = Path(directory) / "sock"
        server = socket.socket(socket.AF_UNIX)
        try:
            server.bind(str(path))
            server.listen(1)
            yield path
        finally:
            server.close()


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("background", BACKGROUND)
def test_saving_a_socket_is_refused_as_invalid_input_naming_it(
    tmp_path: Path, socket_file: Path, background: bool
) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="socket") as refused:
        _save(tmp_path / "checkpoint", socket_file, background=background)
    assert str(socket_file) in str(refused.value)


def test_saving_a_str_that_is_no_path_says_a_str_is_a_path_and_text_must_be_bytes(tmp_path: Path) -> None:
    with pytest.raises(
        CheckpointNotFoundError, match=r"reads a str as a path.*pass bytes \(text\.encode\(\)\)"
    ):
        Checkpoint(str(tmp_path / "checkpoint")).save_sync("hello world")


@pytest.mark.parametrize("background", BACKGROUND)
def test_saving_a_device_file_is_refused_as_invalid_input(tmp_path: Path, background: bool) -> None:
    with pytest.raises(InvalidCheckpointInputError, match=r"/dev/null: it is a device node"):
        _save(tmp_path / "checkpoint", Path("/dev/null"), background=background)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("background", BACKGROUND)
def test_saving_a_fifo_is_refused_without_blocking_on_it(
    tmp_path: Path, fifo: Path, background: bool
) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="FIFO"):
        _save(tmp_path / "checkpoint", fifo, background=background)


@pytest.mark.parametrize("special", ["socket", "fifo", "device"])
def test_refusing_a_special_file_leaves_the_previous_checkpoint_untouched(
    tmp_path: Path, socket_file: Path, fifo: Path, special: str
) -> None:
    dest = tmp_path / "checkpoint"
    dest.write_bytes(OLD_CHECKPOINT)
    data = {"socket": socket_file, "fifo": fifo, "device": Path("/dev/null")}[special]
    with pytest.raises(InvalidCheckpointInputError):
        _save(dest, data, background=False)
    assert dest.read_bytes() == OLD_CHECKPOINT
    assert temp_files_for(dest) == []


# -- a symlinked directory --------------------------------------------------------------------


@pytest.fixture
def real_dir(tmp_path: Path) -> Path:
    """The directory that ``link`` points to: files, a subdirectory and an in-tree relative link."""
    root = tmp_path / "real"
    (root / "sub").mkdir(parents=True)
    (root / "weights.bin").write_bytes(os.urandom(10_000))
    (root / "sub" / "config.json").write_text('{"step": 7}')
    os.symlink("sub/config.json", root / "config-link")
    return root


@pytest.fixture
def linked_dir(real_dir: Path) -> Path:
    """A symbolic link to ``real_dir``: what the task passes to ``save``."""
    link = real_dir.parent / "link"
    os.symlink(real_dir, link)
    return link


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    target = tmp_path / "outside" / "secret"
    target.parent.mkdir()
    target.write_text("not part of the checkpoint")
    return target


@pytest.mark.parametrize("background", BACKGROUND)
def test_saving_a_symlink_to_a_directory_saves_the_directory_it_points_to(
    tmp_path: Path, real_dir: Path, linked_dir: Path, background: bool
) -> None:
    _save(tmp_path / "checkpoint", linked_dir, background=background)
    assert _load(tmp_path / "checkpoint") == tree_of(real_dir)


@pytest.mark.parametrize("background", BACKGROUND)
def test_a_relative_link_inside_a_symlinked_directory_is_stored_as_a_link(
    tmp_path: Path, linked_dir: Path, background: bool
) -> None:
    _save(tmp_path / "checkpoint", linked_dir, background=background)
    with Checkpoint("unused-destination", str(tmp_path / "checkpoint")) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert os.readlink(restored / "config-link") == "sub/config.json"


@pytest.mark.parametrize(
    "background",
    [
        pytest.param(False, id="blocking"),
        pytest.param(True, id="background"),
    ],
)
def test_an_absolute_link_into_the_real_directory_is_stored_as_a_relative_link(
    tmp_path: Path, real_dir: Path, linked_dir: Path, background: bool
) -> None:
    os.symlink(real_dir / "weights.bin", real_dir / "absolute-link")
    _save(tmp_path / "checkpoint", linked_dir, background=background)
    with Checkpoint("unused-destination", str(tmp_path / "checkpoint")) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert os.readlink(restored / "absolute-link") == "weights.bin"


def test_an_absolute_link_through_the_symlinked_path_is_stored_as_a_link(
    tmp_path: Path, real_dir: Path, linked_dir: Path
) -> None:
    os.symlink(linked_dir / "weights.bin", real_dir / "absolute-link")
    _save(tmp_path / "checkpoint", linked_dir, background=False)
    with Checkpoint("unused-destination", str(tmp_path / "checkpoint")) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert os.readlink(restored / "absolute-link") == "weights.bin"


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_a_link_leaving_a_symlinked_directory_is_refused_at_save_naming_the_link(
    tmp_path: Path, real_dir: Path, linked_dir: Path, outside: Path, relative: bool
) -> None:
    target = os.path.relpath(outside, real_dir / "sub") if relative else str(outside)
    os.symlink(target, real_dir / "sub" / "escape")
    with pytest.raises(InvalidCheckpointInputError, match="symbolic link") as refused:
        _save(tmp_path / "checkpoint", linked_dir, background=False)
    assert "sub/escape" in str(refused.value)
    assert not (tmp_path / "checkpoint").exists()


def test_a_background_save_refuses_a_link_leaving_the_tree_naming_the_link(
    tmp_path: Path, real_dir: Path, linked_dir: Path, outside: Path
) -> None:
    os.symlink(str(outside), real_dir / "sub" / "escape")
    with pytest.raises(InvalidCheckpointInputError) as refused:
        _save(tmp_path / "checkpoint", linked_dir, background=True)
    message = str(refused.value)
    assert str(real_dir / "sub" / "escape") in message or str(linked_dir / "sub" / "escape") in message


# -- a full disk ------------------------------------------------------------------------------

FSIZE_LIMIT = 1 << 20
"""RLIMIT_FSIZE of the saving child: any file it writes may not grow past 1 MiB."""


@dataclass(frozen=True)
class FullDiskSave:
    dest: Path
    returncode: int
    said: list[str]


@pytest.fixture(params=["bytes", "file", "dir"])
def full_disk_save(request: pytest.FixtureRequest, tmp_path: Path) -> FullDiskSave:
    """A child process saves 4 MiB over a good checkpoint with a 1 MiB file-size limit."""
    kind: str = request.param
    dest = tmp_path / "store" / "checkpoint"
    with Checkpoint(str(dest)) as checkpoint:
        checkpoint.save_sync(OLD_CHECKPOINT)
    if kind == "dir":
        source = tmp_path / "tree"
        (source / "nested").mkdir(parents=True)
        (source / "a.bin").write_bytes(os.urandom(3 << 20))
        (source / "nested" / "b.bin").write_bytes(os.urandom(1 << 20))
    else:
        source = tmp_path / "new.bin"
        source.write_bytes(os.urandom(4 << 20))
    command = [sys.executable, "-m", "tests.faults.crash.workers", "save", "--kind", kind]
    command += ["--source", str(source), "--dest", str(dest), "--fsize-limit", str(FSIZE_LIMIT)]
    result = subprocess.run(
        command,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,  # run() kills and reaps the child on timeout
        start_new_session=True,
        check=False,
    )
    return FullDiskSave(dest, result.returncode, result.stdout.splitlines())


def test_a_save_that_fills_the_disk_raises_a_storage_error_saying_out_of_space(
    full_disk_save: FullDiskSave,
) -> None:
    assert full_disk_save.returncode == 1, full_disk_save.said
    error = full_disk_save.said[-1]
    assert error.startswith("error CheckpointStorageError out of space saving "), full_disk_save.said


def test_a_save_that_fills_the_disk_keeps_the_previous_checkpoint_byte_identical(
    full_disk_save: FullDiskSave,
) -> None:
    assert full_disk_save.dest.read_bytes() == OLD_CHECKPOINT
    with Checkpoint("unused-destination", str(full_disk_save.dest)) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == OLD_CHECKPOINT


def test_a_save_that_fills_the_disk_leaves_no_temp_file_behind(full_disk_save: FullDiskSave) -> None:
    assert sorted(os.listdir(full_disk_save.dest.parent)) == ["checkpoint"]


def test_a_file_that_cannot_be_read_fails_a_blocking_save_with_a_typed_error_naming_it(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_to_open(monkeypatch, "weights.bin", errno.EACCES)  # root reads everything: injected
    with pytest.raises(CheckpointPermissionError, match="chmod u") as raised:
        Checkpoint(str(tmp_path / "obj")).save_sync(model_dir)
    assert str(model_dir / "weights.bin") in str(raised.value)
    assert not (tmp_path / "obj").exists()


@pytest.mark.parametrize("background", [False, True])
def test_saving_a_directory_to_a_destination_inside_it_is_refused(model_dir: Path, background: bool) -> None:
    destination = model_dir / "checkpoints" / "latest"
    with pytest.raises(
        InvalidCheckpointInputError, match="the destination is inside the directory"
    ) as raised:
        Checkpoint(destination).save_sync(model_dir, background=background)
    assert str(model_dir) in str(raised.value)
    assert not destination.exists()


def test_a_destination_inside_the_directory_through_a_symlink_is_refused(
    tmp_path: Path, model_dir: Path
) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(model_dir)
    with pytest.raises(InvalidCheckpointInputError, match="inside the directory being saved"):
        Checkpoint(model_dir / "ckpt").save_sync(alias)


def test_a_destination_beside_the_directory_with_a_shared_name_prefix_is_accepted(
    tmp_path: Path, model_dir: Path
) -> None:
    Checkpoint(f"{model_dir}-checkpoint").save_sync(model_dir)
    assert Path(f"{model_dir}-checkpoint").stat().st_size > 0
