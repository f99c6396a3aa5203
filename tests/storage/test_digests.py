"""The digest recorded with every object: CRC32 by default, labelled with its algorithm."""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, CheckpointCorruptError
from flyte_checkpoint.storage import DIGEST_KEY, backend_for
from flyte_checkpoint.storage.digests import ContentDigest, digest_of
from flyte_checkpoint.storage.stores.local import XATTR_NAME, decode_record, encode_record


def record_digest(target: Path, digest: bytes) -> None:
    """Replace the digest recorded with a local object (its other records stay)."""
    record = decode_record(os.getxattr(target, XATTR_NAME))
    record[DIGEST_KEY] = digest.decode()
    os.setxattr(target, XATTR_NAME, encode_record(record))


def test_the_default_digest_is_a_labelled_crc32_equal_to_zlibs() -> None:
    data = os.urandom(100_000)
    assert digest_of(data) == f"crc32:{zlib.crc32(data):08x}"


def test_a_digest_fed_in_pieces_equals_the_digest_of_the_whole() -> None:
    data = os.urandom(300_001)
    digest = ContentDigest()
    for start in range(0, len(data), 65_536):
        digest.update(memoryview(data)[start : start + 65_536])
    assert digest.value == digest_of(data)


def test_a_sha256_digest_carries_its_own_label() -> None:
    assert digest_of(b"abc", "sha256") == "sha256:" + hashlib.sha256(b"abc").hexdigest()


def test_an_object_recorded_with_a_sha256_digest_is_checked_with_sha256(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(b"precious")
    record_digest(target, digest_of(b"precious", "sha256").encode())
    restored = Checkpoint(str(tmp_path / "unused"), str(target)).load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"precious"


def test_a_sha256_digest_that_does_not_match_is_reported_as_damage(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(b"precious")
    record_digest(target, digest_of(b"other", "sha256").encode())
    with pytest.raises(CheckpointCorruptError, match="does not match the digest"):
        Checkpoint(str(tmp_path / "unused"), str(target)).load_sync()


def test_a_digest_of_an_unknown_algorithm_asks_for_an_upgrade(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    Checkpoint(str(target)).save_sync(b"precious")
    record_digest(target, b"blake9:0123")
    with pytest.raises(CheckpointCorruptError, match="newer flyte-checkpoint: upgrade"):
        backend_for(str(target)).open_read(str(target))
