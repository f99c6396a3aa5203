"""Local disk storage: atomic replace, temp-file hygiene and recorded metadata."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointCorruptError, CheckpointStorageError, ConfigurationError
from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.positional import PositionalReads
from flyte_checkpoint.storage import DIGEST_KEY, FORMAT_KEY, SIZE_KEY, backend_for, copy_object
from flyte_checkpoint.storage.base import VerifyingReader
from flyte_checkpoint.storage.digests import digest_of
from flyte_checkpoint.storage.stores.local import (
    STAMP_KEY,
    XATTR_NAME,
    decode_record,
    encode_record,
    remove_stale_temp_files,
    retired_names_for,
    temp_files_for,
)
from tests.conftest import damage_in_place, truncate_in_place


def write(uri: str, data: bytes, fmt: str = "payload") -> None:
    with backend_for(uri).open_write(uri, {FORMAT_KEY: fmt}) as writer:
        writer.write(data)


def read_to_end(reader: VerifyingReader) -> None:
    while reader.read(2):
        pass


def test_nothing_is_visible_before_commit(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    writer = backend_for(str(target)).open_write(str(target), {})
    writer.write(b"partial")
    assert not target.exists()
    writer.commit()
    assert target.read_bytes() == b"partial"


def test_an_exception_inside_the_write_keeps_the_old_object(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"old")

    def crash_mid_write() -> None:
        with backend_for(str(target)).open_write(str(target), {}) as writer:
            writer.write(b"new but unfinished")
            raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        crash_mid_write()
    assert target.read_bytes() == b"old"
    assert temp_files_for(target) == []


def test_a_keyboard_interrupt_inside_the_write_keeps_the_old_object(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"old")

    def interrupt_mid_write() -> None:
        with backend_for(str(target)).open_write(str(target), {}) as writer:
            writer.write(b"new")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupt_mid_write()
    assert target.read_bytes() == b"old"


def test_the_format_and_digest_are_recorded_with_the_object(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"abc", fmt="archive")
    info = backend_for(str(target)).info(str(target))
    assert info is not None
    assert info.recorded_format == "archive"
    assert info.metadata[DIGEST_KEY] == "crc32:352441c2"


def test_a_read_of_altered_bytes_fails_the_digest_check(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"abcdef")
    damage_in_place(target, 0, b"X")
    reader = backend_for(str(target)).open_read(str(target))
    assert reader is not None
    with reader, pytest.raises(CheckpointCorruptError, match="does not match the digest"):
        read_to_end(reader)


def test_a_read_of_a_truncated_object_fails_the_size_check(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"abcdef")
    truncate_in_place(target, 3)
    reader = backend_for(str(target)).open_read(str(target))
    assert reader is not None
    with reader, pytest.raises(CheckpointCorruptError, match="read 3 bytes"):
        read_to_end(reader)


@pytest.mark.parametrize("suffix", [".fc-tmp", ".fc-old"], ids=["temp file", "retired second name"])
def test_names_left_by_a_killed_save_are_removed_by_the_next_save(tmp_path: Path, suffix: str) -> None:
    target = tmp_path / "obj"
    orphan = tmp_path / f".obj.deadbeef{suffix}"
    orphan.write_bytes(b"left by a killed process")
    write(str(target), b"fresh")
    assert not orphan.exists()
    assert target.read_bytes() == b"fresh"


def test_a_temp_file_still_locked_by_a_live_writer_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    live = tmp_path / ".obj.cafe.fc-tmp"
    live.write_bytes(b"being written")
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_stale_temp_files(target) == 0
        assert live.exists()
    finally:
        os.close(fd)
    assert remove_stale_temp_files(target) == 1


def test_temp_files_of_other_objects_are_not_touched(tmp_path: Path) -> None:
    other = tmp_path / ".other.1234.fc-tmp"
    other.write_bytes(b"x")
    write(str(tmp_path / "obj"), b"y")
    assert other.exists()


def test_copy_keeps_the_bytes_and_the_format_record(tmp_path: Path) -> None:
    write(str(tmp_path / "a"), b"payload bytes", fmt="archive")
    assert copy_object(str(tmp_path / "a"), str(tmp_path / "b"))
    info = backend_for(str(tmp_path / "b")).info(str(tmp_path / "b"))
    assert info is not None
    assert (tmp_path / "b").read_bytes() == b"payload bytes"
    assert info.recorded_format == "archive"


def test_copy_of_a_missing_object_reports_false(tmp_path: Path) -> None:
    assert copy_object(str(tmp_path / "none"), str(tmp_path / "b")) is False
    assert not (tmp_path / "b").exists()


def test_an_unwritable_directory_is_a_permission_error_naming_the_path() -> None:
    # Root ignores directory permissions, so the save runs as "nobody" in a child process
    # (after its imports, which need the interpreter under /root).
    locked = Path(tempfile.mkdtemp(prefix="fc-locked-", dir="/tmp"))
    try:
        locked.chmod(0o755)
        script = (
            "import os, sys\n"
            "from flyte_checkpoint import Checkpoint, CheckpointPermissionError\n"
            "if os.geteuid() == 0: os.setgid(65534); os.setuid(65534)\n"
            "try:\n"
            f"    Checkpoint({str(locked / 'sub' / 'obj')!r}).save_sync(b'x')\n"
            "except CheckpointPermissionError as exc:\n"
            "    print(exc); sys.exit(3)\n"
        )
        if os.geteuid() != 0:
            locked.chmod(0o555)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert result.returncode == 3, result.stderr
        assert str(locked) in result.stdout
        assert "permission denied" in result.stdout
    finally:
        locked.chmod(0o755)
        shutil.rmtree(locked)


def test_an_object_rewritten_in_place_by_another_tool_is_read_without_the_stale_record(
    tmp_path: Path,
) -> None:
    target = tmp_path / "obj"
    write(str(target), b"ours, with a digest", fmt="archive")
    time.sleep(0.01)  # a later write gets a later modification time
    with open(target, "wb") as handle:  # what the reference SDK does: same inode, xattrs kept
        handle.write(b"theirs")
    info = backend_for(str(target)).info(str(target))
    assert info is not None
    assert info.recorded_digest is None
    assert info.recorded_format is None


def test_an_object_damaged_where_it_lies_keeps_its_record(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"ours, with a digest")
    damage_in_place(target, 0, b"O")
    info = backend_for(str(target)).info(str(target))
    assert info is not None
    assert info.recorded_digest is not None


@pytest.fixture
def sync_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records the order of fsync and rename calls (a spy: nothing else observes an fsync)."""
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        kind = "directory" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"
        calls.append(f"fsync {kind}")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_a_local_write_is_atomic_without_fsync_by_default(tmp_path: Path, sync_calls: list[str]) -> None:
    write(str(tmp_path / "obj"), b"data")
    assert sync_calls == ["rename"]


def test_the_fsync_option_syncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, sync_calls: list[str]
) -> None:
    target = str(tmp_path / "obj")
    with backend_for(target, {"fsync": True}).open_write(target, {}) as writer:
        writer.write(b"data")
    assert sync_calls == ["fsync file", "rename", "fsync directory"]


def test_the_fsync_option_also_syncs_the_parents_of_directories_it_created(
    tmp_path: Path, sync_calls: list[str]
) -> None:
    target = str(tmp_path / "new" / "deeper" / "obj")
    with backend_for(target, {"fsync": True}).open_write(target, {}) as writer:
        writer.write(b"data")
    assert sync_calls == ["fsync file", "rename"] + ["fsync directory"] * 3


def test_the_environment_variable_turns_fsync_on_for_every_checkpoint(
    tmp_path: Path, sync_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_CHECKPOINT_FSYNC", "1")
    Checkpoint(str(tmp_path / "obj")).save_sync(b"data")
    assert sync_calls[:2] == ["fsync file", "rename"]


def test_the_storage_option_wins_over_the_environment_variable(
    tmp_path: Path, sync_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_CHECKPOINT_FSYNC", "yes")
    Checkpoint(str(tmp_path / "obj"), storage_options={"fsync": False}).save_sync(b"data")
    assert sync_calls == ["rename"]


def test_a_fsync_environment_value_that_is_not_yes_or_no_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_CHECKPOINT_FSYNC", "always")
    with pytest.raises(ConfigurationError, match="FLYTE_CHECKPOINT_FSYNC='always' is not a yes/no"):
        Checkpoint(str(tmp_path / "obj"))


def test_a_fsync_storage_option_that_is_not_a_bool_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'fsync' must be True or False"):
        Checkpoint(str(tmp_path / "obj"), storage_options={"fsync": "true"})


def test_the_record_of_a_large_object_fits_inside_an_ext4_inode(tmp_path: Path) -> None:
    record = {
        FORMAT_KEY: "archive",
        DIGEST_KEY: "crc32:ffffffff",
        SIZE_KEY: str(10**13 - 1),
        STAMP_KEY: str(time.time_ns()),
    }
    assert len(encode_record(record)) <= 56
    assert decode_record(encode_record(record)) == record


def test_a_record_that_is_not_ours_reads_as_no_record() -> None:
    assert decode_record(b'{"flyte_checkpoint_format": "payload"}') == {}


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    """20 MiB: more than two steps of the kernel copy."""
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(20 << 20))
    return path


def count_kernel_copies(
    monkeypatch: pytest.MonkeyPatch, fail: OSError | None = None, after: int = 0
) -> list[int]:
    """A spy on ``os.copy_file_range`` that can also inject ``fail`` after ``after`` calls."""
    calls: list[int] = []
    real = os.copy_file_range

    def copy_file_range(*args: Any) -> int:
        calls.append(args[2])
        if fail is not None and len(calls) > after:
            raise fail
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    return calls


def test_a_local_file_save_is_copied_by_the_kernel_and_records_the_digest_of_what_was_stored(
    tmp_path: Path, big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_kernel_copies(monkeypatch)
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(big_file)
    assert len(calls) >= 3
    assert target.read_bytes() == big_file.read_bytes()
    info = backend_for(str(target)).info(str(target))
    assert info is not None
    assert info.recorded_digest == digest_of(big_file.read_bytes())


def test_where_the_kernel_cannot_copy_the_file_is_read_and_written_instead(
    tmp_path: Path, big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_kernel_copies(monkeypatch, fail=OSError(errno.EXDEV, "cross-device"))
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(big_file)
    restored = Checkpoint("unused", str(target)).load_sync()
    assert restored is not None
    assert restored.read_bytes() == big_file.read_bytes()


def test_a_kernel_copy_failing_mid_file_fails_the_save_and_keeps_the_old_object(
    tmp_path: Path, big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(b"old")
    count_kernel_copies(monkeypatch, fail=OSError(errno.EIO, "I/O error"), after=1)
    with pytest.raises(CheckpointStorageError, match="obj"):
        Checkpoint(str(target)).save_sync(big_file)
    assert target.read_bytes() == b"old"
    assert temp_files_for(target) == []


def test_a_file_is_copied_from_its_current_position_to_its_end(tmp_path: Path, big_file: Path) -> None:
    target = str(tmp_path / "obj")
    with big_file.open("rb") as source, backend_for(target).open_write(target, {}) as writer:
        source.read(1000)
        assert writer.write_from(source) == (20 << 20) - 1000
        assert source.read() == b""
    assert Path(target).read_bytes() == big_file.read_bytes()[1000:]


def wait_until_released(target: Path) -> list[Path]:
    """The second names of ``target`` still on disk once the reaper had up to 5 s."""
    deadline = time.monotonic() + 5
    while retired_names_for(target) and time.monotonic() < deadline:
        time.sleep(0.01)
    return retired_names_for(target)


def test_a_replaced_object_is_freed_and_leaves_no_second_name_behind(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"old")
    write(str(target), b"new")
    assert wait_until_released(target) == []
    assert [p.name for p in tmp_path.iterdir()] == ["obj"]
    assert target.read_bytes() == b"new"


def test_the_object_being_replaced_has_a_second_name_when_the_rename_drops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "obj"
    write(str(target), b"old")
    seen: list[tuple[int, list[bytes]]] = []
    real_replace = os.replace

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append((os.stat(dst).st_nlink, [p.read_bytes() for p in retired_names_for(target)]))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write(str(target), b"new")
    assert seen == [(2, [b"old"])]


def test_listing_a_prefix_never_shows_second_names(tmp_path: Path) -> None:
    (tmp_path / ".obj.0123456789abcdef.fc-old").write_bytes(b"retired")
    (tmp_path / "other").write_bytes(b"x")
    assert backend_for(str(tmp_path)).list_prefix(str(tmp_path)) == [str(tmp_path / "other")]


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


def test_a_process_that_exits_while_the_reaper_holds_a_name_leaves_no_second_name(tmp_path: Path) -> None:
    # The interpreter stops its daemon threads wherever they are at exit: here the reaper has
    # taken the name off its queue and not yet unlinked it.
    script = """
import sys, threading, time
from flyte_checkpoint import Checkpoint
from flyte_checkpoint.storage import deferred_unlink
reaper = deferred_unlink._REAPER
def stalled() -> None:
    reaper._queue.get()
    threading.Event().wait()
reaper._run = stalled
Checkpoint(sys.argv[1]).save_sync(b"old")
Checkpoint(sys.argv[1]).save_sync(b"new")
while not reaper._queue.empty():
    time.sleep(0.01)
"""
    target = tmp_path / "obj"
    result = run_python(script, str(target))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["obj"]
    assert target.read_bytes() == b"new"


def test_an_interrupt_right_after_the_second_name_is_made_leaves_none_once_the_process_ends(
    tmp_path: Path,
) -> None:
    script = """
import os, sys
from flyte_checkpoint import Checkpoint
Checkpoint(sys.argv[1]).save_sync(b"old")
real_link = os.link
def link_then_interrupt(*args, **kwargs) -> None:
    real_link(*args, **kwargs)
    raise KeyboardInterrupt
os.link = link_then_interrupt
try:
    Checkpoint(sys.argv[1]).save_sync(b"new")
except KeyboardInterrupt:
    print("interrupted")
"""
    target = tmp_path / "obj"
    result = run_python(script, str(target))
    assert result.stdout.split() == ["interrupted"], result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["obj"]
    assert target.read_bytes() == b"old"


DATA = os.urandom(10_000)


@pytest.fixture
def opened_object(tmp_path: Path) -> Iterator[tuple[VerifyingReader, PositionalReads]]:
    """A local object of :data:`DATA`, opened, with its reads at offsets."""
    target = tmp_path / "obj"
    write(str(target), DATA)
    reader = backend_for(str(target)).open_read(str(target))
    assert reader is not None
    with reader:
        positional = reader.positional_reads()
        assert positional is not None
        yield reader, positional


def test_a_local_object_read_at_offsets_and_skipped_with_true_crcs_passes_its_check(
    opened_object: tuple[VerifyingReader, PositionalReads],
) -> None:
    reader, positional = opened_object
    assert reader.read(100) == DATA[:100]
    assert positional.read_at(100, 20_000) == DATA[100:]  # short only at the end
    positional.skip(len(DATA) - 100, zlib.crc32(DATA[100:]))
    assert positional.consumed() == len(DATA)
    assert reader.read(1) == b""
    assert reader.verified


def test_reads_in_order_go_on_after_the_bytes_skipped(
    opened_object: tuple[VerifyingReader, PositionalReads],
) -> None:
    reader, positional = opened_object
    assert reader.read(100) == DATA[:100]
    positional.skip(1_000, zlib.crc32(DATA[100:1_100]))  # two skips with no read between
    positional.skip(1_000, zlib.crc32(DATA[1_100:2_100]))
    assert reader.read(50) == DATA[2_100:2_150]
    positional.skip(len(DATA) - 2_150, zlib.crc32(DATA[2_150:]))
    assert reader.read(1) == b""
    assert reader.verified


def test_a_local_object_skipped_with_a_wrong_crc_fails_its_digest_check(
    opened_object: tuple[VerifyingReader, PositionalReads],
) -> None:
    reader, positional = opened_object
    positional.skip(len(DATA), zlib.crc32(DATA) ^ 1)
    with pytest.raises(CheckpointCorruptError, match="does not match the digest"):
        reader.read(1)


def test_a_local_object_recorded_with_sha256_is_read_only_in_order(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    write(str(target), b"abcdef")
    record = decode_record(os.getxattr(target, XATTR_NAME))
    record[DIGEST_KEY] = digest_of(b"abcdef", "sha256")
    os.setxattr(target, XATTR_NAME, encode_record(record))
    reader = backend_for(str(target)).open_read(str(target))
    assert reader is not None
    with reader:
        assert reader.positional_reads() is None  # pieces read apart cannot be joined into a SHA-256


def test_a_directory_checkpoint_damaged_outside_every_members_crc_is_refused_on_load(
    tmp_path: Path, model_dir: Path
) -> None:
    (model_dir / "big.bin").write_bytes(os.urandom(3 << 20))  # members read at their offsets
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(model_dir)
    data = target.read_bytes()
    second = members.frame(data[: members.HEADER_PREFIX], 0).length
    damage_in_place(target, second + 4, b"\x01")  # the second member's gzip MTIME: no CRC covers it
    with pytest.raises(CheckpointCorruptError, match="does not match the digest"):
        Checkpoint(str(tmp_path / "unused"), str(target)).load_sync()
