"""Extraction writes files' data on a pool of threads: the same tree, errors raised, nothing left open.

The archives are real ones written by :func:`archive.pack_directory`; the only fault injected
is a full disk on a writing thread (``os.pwritev`` raising ENOSPC), which a real disk cannot be
made to produce on demand part-way through one file.
"""

from __future__ import annotations

import errno
import io
import os
import threading
from pathlib import Path

import pytest

from flyte_checkpoint import CheckpointCorruptError, archive
from flyte_checkpoint.archive import extract, member_reader
from tests.conftest import tree_of

MIB = 1 << 20


def packed(source: Path) -> bytes:
    sink = io.BytesIO()
    archive.pack_directory(source, sink)
    return sink.getvalue()


def large_tree(root: Path) -> Path:
    root.mkdir()
    for number in range(4):
        (root / f"shard-{number}.bin").write_bytes(os.urandom(3 * MIB + 1000 * number))
    (root / "logs").mkdir()
    (root / "logs" / "train.txt").write_bytes(b"step=1 loss=0.5\n" * 200_000)
    (root / "small.json").write_text('{"step": 3}')
    os.chmod(root / "shard-1.bin", 0o640)
    os.utime(root / "shard-2.bin", (1_600_000_000, 1_600_000_000))
    return root


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def writing_threads() -> list[str]:
    prefixes = (extract.THREAD_PREFIX, member_reader.THREAD_PREFIX)
    return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]


def test_a_tree_written_on_two_threads_is_the_tree_that_was_saved(tmp_path: Path) -> None:
    source = large_tree(tmp_path / "source")
    restored = tmp_path / "restored"
    archive.unpack_archive(io.BytesIO(packed(source)), restored, threads=2)
    assert tree_of(restored) == tree_of(source)


def test_files_written_on_two_threads_keep_their_mode_and_mtime(tmp_path: Path) -> None:
    source = large_tree(tmp_path / "source")
    restored = tmp_path / "restored"
    archive.unpack_archive(io.BytesIO(packed(source)), restored, threads=2)
    for name in ("shard-1.bin", "shard-2.bin", "logs/train.txt"):
        before, after = os.stat(source / name), os.stat(restored / name)
        assert (after.st_mode & 0o777, int(after.st_mtime)) == (before.st_mode & 0o777, int(before.st_mtime))


def test_a_file_with_zeros_off_chunk_boundaries_comes_back_with_holes(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_bytes(b"x" * 777)  # puts the next file's data off any MiB boundary
    with open(source / "zeros.bin", "wb") as out:
        out.write(b"head")
        out.truncate(32 * MIB)
    restored = tmp_path / "restored"
    archive.unpack_archive(io.BytesIO(packed(source)), restored, threads=2)
    assert (restored / "zeros.bin").read_bytes() == (source / "zeros.bin").read_bytes()
    assert os.stat(restored / "zeros.bin").st_blocks * 512 < 4 * MIB


def test_a_full_disk_on_a_writing_thread_is_raised_and_leaves_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = packed(large_tree(tmp_path / "source"))
    writes = 0
    real_pwritev = os.pwritev

    def pwritev_until_full(fd: int, parts: list[memoryview], offset: int) -> int:
        nonlocal writes
        writes += 1
        if writes > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwritev(fd, parts, offset)

    monkeypatch.setattr(os, "pwritev", pwritev_until_full)
    before = open_descriptors()
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)) as raised:
        archive.unpack_archive(io.BytesIO(data), tmp_path / "restored", threads=2)
    assert raised.value.errno == errno.ENOSPC
    assert open_descriptors() <= before
    assert writing_threads() == []


def test_an_extraction_stopped_by_damage_leaves_no_file_open_and_no_thread(tmp_path: Path) -> None:
    data = packed(large_tree(tmp_path / "source"))
    cut = data[: len(data) * 2 // 3]
    before = open_descriptors()
    with pytest.raises(CheckpointCorruptError):
        archive.unpack_archive(io.BytesIO(cut), tmp_path / "restored", threads=2)
    assert open_descriptors() <= before
    assert writing_threads() == []
