"""A file replaced while an incremental save hashes it fails the save, even when the new file
carries the old one's modification time (as ``cp -p`` or ``rsync -t`` leave it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyte_checkpoint.errors import InputChangedError
from flyte_checkpoint.incremental import ChunkStore


def test_a_file_replaced_by_one_with_the_same_mtime_fails_the_hashing(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 1000)
    walked = os.lstat(path)  # what the save's walk saw
    replacement = tmp_path / "incoming"
    replacement.write_bytes(b"b" * 2000)
    os.utime(replacement, ns=(walked.st_atime_ns, walked.st_mtime_ns))
    os.replace(replacement, path)
    store = ChunkStore(str(tmp_path / "chunks"))
    with pytest.raises(InputChangedError, match="modified while it was being saved"):
        store.chunks_of(str(path), walked)
