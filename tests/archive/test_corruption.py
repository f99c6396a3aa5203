"""Damaged checkpoints must be refused with ``CheckpointCorruptError``, never restored quietly.

A directory of about 2 MiB (random and text files) is saved with ``Checkpoint.save_sync`` to a
local destination, which records its format, size and digest as extended attributes. Each test
damages fresh copies of that object (one byte inverted, a truncation, a zeroed range) and loads
them, either

* **with** the recorded attributes copied over: the digest catches every change; or
* **without** them (``stripped``): the object is then sniffed like one written by another tool,
  and only the gzip CRC-32 and length, the tar header checksums and the tar structure can tell.

What cannot be detected without the digest is exactly what carries no content:

* gzip header bytes 4-9 (MTIME, XFL, OS) are read by no decoder: the damaged object restores the
  very same tree;
* gzip magic bytes 0-1: the object is no longer recognisable as gzip, and an unrecognised object
  with no recorded format is, by specification, a raw payload; it is restored as ``payload``,
  byte for byte what is stored, so nothing is silently altered;
* likewise a truncation to 1 byte (``1f``) or a zeroed range at offset 0.

A byte is "inverted" by XOR with ``0xff``. Positions are seeded, so every run tries the same ones.
Counts are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import errno
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from flyte_checkpoint import (
    PAYLOAD_BASENAME,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointStorageError,
    archive,
)
from flyte_checkpoint.storage import DIGEST_KEY, SIZE_KEY
from flyte_checkpoint.storage.stores.local import STAMP_KEY, XATTR_NAME, decode_record
from tests.conftest import tree_of

SEED = 20_260_706
GZIP_CONTENT_FREE = frozenset(range(4, 10))  # MTIME (4 bytes), XFL, OS
GZIP_MAGIC = frozenset({0, 1})


@dataclass(frozen=True)
class Saved:
    """A directory checkpoint saved by this package: its tree, bytes and recorded attributes."""

    directory: Path
    data: bytes
    xattrs: dict[str, bytes]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    root = tmp_path_factory.mktemp("saved")
    directory = root / "tree"
    rng = random.Random(SEED)
    (directory / "weights").mkdir(parents=True)
    for index in range(4):
        (directory / "weights" / f"shard-{index}.bin").write_bytes(rng.randbytes(256 * 1024))
    words = ["loss", "step", "epoch", "rank", "grad", "adam", "β", "résumé", "layer", "norm"]
    (directory / "logs" / "nested" / "deeper").mkdir(parents=True)
    for index in range(20):
        text = " ".join(rng.choice(words) for _ in range(10_000))
        (directory / "logs" / f"log {index}.txt").write_text(text)
    (directory / "logs" / "nested" / "deeper" / "empty").write_bytes(b"")
    (directory / "empty-dir").mkdir()
    target = root / "object"
    Checkpoint(str(target)).save_sync(directory)
    xattrs = {name: os.getxattr(target, name) for name in os.listxattr(target)}
    assert DIGEST_KEY in record_of(xattrs), "the save should record a digest"
    return Saved(directory=directory, data=target.read_bytes(), xattrs=xattrs)


@dataclass(frozen=True)
class Outcome:
    """What one load of a damaged object did."""

    error: CheckpointCorruptError | None
    restored: dict[str, bytes | None] | None
    payload: bytes | None


Loader = Callable[[bytes, dict[str, bytes]], Outcome]


def record_of(xattrs: dict[str, bytes]) -> dict[str, str]:
    """The metadata this package recorded with an object, from its extended attributes."""
    return decode_record(xattrs[XATTR_NAME])


@pytest.fixture
def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Loader:
    """Write ``data`` as a fresh object (with the given xattrs), load it, check the invariants."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    counter = iter(range(1 << 30))

    def run(data: bytes, xattrs: dict[str, bytes]) -> Outcome:
        source = tmp_path / f"object-{next(counter)}"
        with open(source, "wb") as out:
            out.write(data)
        for name, value in xattrs.items():
            os.setxattr(source, name, value)
        if XATTR_NAME in xattrs:  # damaged where it lies, as bit rot does: its write time stays
            stamp = int(record_of(xattrs)[STAMP_KEY])
            os.utime(source, ns=(stamp, stamp))
        checkpoint = Checkpoint(str(tmp_path / "unused"), str(source))
        try:
            error: CheckpointCorruptError | None = None
            try:
                restored = checkpoint.load_sync()
            except CheckpointCorruptError as exc:
                error = exc
            if error is not None:
                assert str(source) in str(error), f"the error should name the source: {error}"
                assert list(checkpoint.path.iterdir()) == [], "a refused load leaves the workspace empty"
                workspace = checkpoint.path.name
                assert sorted(os.listdir(temp)) == [workspace, f"{workspace}.lock"], (
                    "nothing but the workspace"
                )
                return Outcome(error, None, None)
            assert restored is not None, "a damaged, non-empty object never means 'no checkpoint'"
            if restored.name == PAYLOAD_BASENAME:
                return Outcome(None, None, restored.read_bytes())
            return Outcome(None, tree_of(restored), None)
        finally:
            checkpoint.close()
            source.unlink()

    return run


def inverted(data: bytes, position: int) -> bytes:
    damaged = bytearray(data)
    damaged[position] ^= 0xFF
    return bytes(damaged)


def flip_positions(size: int) -> list[int]:
    """The gzip header and the trailer, then 200 seeded positions spread over the whole object."""
    rng = random.Random(SEED)
    spread = [rng.randrange(size * part // 200, size * (part + 1) // 200) for part in range(200)]
    return sorted({*range(16), *range(size - 8, size), *spread})


def truncation_lengths(size: int) -> list[int]:
    rng = random.Random(SEED + 1)
    fixed = {1, 2, 10, 11, 100, size // 2, size - 8, size - 4, size - 1}
    return sorted(fixed | set(rng.sample(range(2, size), 30)))


def zeroed(data: bytes, start: int, length: int) -> bytes:
    return data[:start] + bytes(len(data[start : start + length])) + data[start + length :]


def zero_ranges(size: int) -> list[tuple[int, int]]:
    return [(0, 512), (10, 512), (size // 3, 4096), (size // 2, 1), (size - 4096, 4096), (size - 8, 8)]


def report(case: str, tried: int, detected: int) -> None:
    print(f"\n[corruption] {case}: {tried} tried, {detected} detected")


# ---------------------------------------------------------------------------------------------
# With the recorded digest: everything is detected
# ---------------------------------------------------------------------------------------------


def test_every_inverted_byte_is_detected_when_the_digest_is_recorded(saved: Saved, load: Loader) -> None:
    positions = flip_positions(len(saved.data))
    missed = [p for p in positions if load(inverted(saved.data, p), saved.xattrs).error is None]
    report("inverted byte, digest recorded", len(positions), len(positions) - len(missed))
    assert len(positions) >= 200
    assert missed == []


def test_every_truncation_is_detected_when_the_digest_is_recorded(saved: Saved, load: Loader) -> None:
    lengths = truncation_lengths(len(saved.data))
    missed = [n for n in lengths if load(saved.data[:n], saved.xattrs).error is None]
    report("truncation, digest recorded", len(lengths), len(lengths) - len(missed))
    assert missed == []


def test_every_zeroed_range_is_detected_when_the_digest_is_recorded(saved: Saved, load: Loader) -> None:
    ranges = zero_ranges(len(saved.data))
    missed = [r for r in ranges if load(zeroed(saved.data, *r), saved.xattrs).error is None]
    report("zeroed range, digest recorded", len(ranges), len(ranges) - len(missed))
    assert missed == []


def test_the_undamaged_object_loads_with_and_without_its_record(saved: Saved, load: Loader) -> None:
    expected = tree_of(saved.directory)
    assert load(saved.data, saved.xattrs).restored == expected
    assert load(saved.data, {}).restored == expected


# ---------------------------------------------------------------------------------------------
# Without it: gzip CRC and length, tar checksums and structure
# ---------------------------------------------------------------------------------------------


def test_without_the_digest_no_inverted_byte_loads_a_different_tree(saved: Saved, load: Loader) -> None:
    """Undetected are the gzip header's content-free bytes and its magic (the object is then a
    payload, by the spec's rule) and, in some streams, a byte of a Huffman table that only
    changes codes the stream never uses, so it decodes to the same bytes. Nothing undetected
    ever restores a tree that differs from what was saved."""
    positions = flip_positions(len(saved.data))
    outcomes = {p: load(inverted(saved.data, p), {}) for p in positions}
    missed = {p for p, outcome in outcomes.items() if outcome.error is None}
    report("inverted byte, no digest", len(positions), len(positions) - len(missed))
    assert missed >= GZIP_CONTENT_FREE | GZIP_MAGIC
    expected = tree_of(saved.directory)
    changed = {p for p in missed - GZIP_MAGIC if outcomes[p].restored != expected}
    assert not changed, f"inverted bytes at {sorted(changed)} loaded a different tree without an error"


def test_without_the_digest_damage_to_gzip_mtime_xfl_or_os_restores_the_same_tree(
    saved: Saved, load: Loader
) -> None:
    expected = tree_of(saved.directory)
    for position in sorted(GZIP_CONTENT_FREE):
        assert load(inverted(saved.data, position), {}).restored == expected, position


def test_without_the_digest_a_damaged_gzip_magic_is_restored_as_the_stored_payload(
    saved: Saved, load: Loader
) -> None:
    for position in sorted(GZIP_MAGIC):
        damaged = inverted(saved.data, position)
        assert load(damaged, {}).payload == damaged, position


def test_without_the_digest_every_truncation_but_the_one_byte_object_is_detected(
    saved: Saved, load: Loader
) -> None:
    """A 1-byte object (``1f``) is indistinguishable from a 1-byte payload; it is restored as one."""
    lengths = truncation_lengths(len(saved.data))
    outcomes = {n: load(saved.data[:n], {}) for n in lengths}
    missed = {n for n, outcome in outcomes.items() if outcome.error is None}
    report("truncation, no digest", len(lengths), len(lengths) - len(missed))
    assert missed == {1}
    assert outcomes[1].payload == saved.data[:1]


def test_without_the_digest_every_zeroed_range_but_one_at_offset_zero_is_detected(
    saved: Saved, load: Loader
) -> None:
    ranges = zero_ranges(len(saved.data))
    outcomes = {r: load(zeroed(saved.data, *r), {}) for r in ranges}
    missed = {r for r, outcome in outcomes.items() if outcome.error is None}
    report("zeroed range, no digest", len(ranges), len(ranges) - len(missed))
    assert missed == {(0, 512)}
    assert outcomes[(0, 512)].payload == zeroed(saved.data, 0, 512)


# ---------------------------------------------------------------------------------------------
# Raw payloads
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_payload(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    root = tmp_path_factory.mktemp("payload")
    target = root / "object"
    data = random.Random(SEED + 2).randbytes(64 * 1024)
    Checkpoint(str(target)).save_sync(data)
    xattrs = {name: os.getxattr(target, name) for name in os.listxattr(target)}
    return Saved(directory=root, data=data, xattrs=xattrs)


def test_every_inverted_byte_of_a_raw_payload_is_detected_when_the_digest_is_recorded(
    saved_payload: Saved, load: Loader
) -> None:
    rng = random.Random(SEED + 3)
    size = len(saved_payload.data)
    positions = sorted({0, 1, size - 1, *rng.sample(range(size), 60)})
    missed = [
        p for p in positions if load(inverted(saved_payload.data, p), saved_payload.xattrs).error is None
    ]
    report("raw payload inverted byte, digest recorded", len(positions), len(positions) - len(missed))
    assert missed == []


def test_a_truncated_raw_payload_is_detected_when_the_digest_is_recorded(
    saved_payload: Saved, load: Loader
) -> None:
    lengths = [1, 100, len(saved_payload.data) // 2, len(saved_payload.data) - 1]
    missed = [n for n in lengths if load(saved_payload.data[:n], saved_payload.xattrs).error is None]
    assert missed == []


def test_a_damaged_raw_payload_without_its_digest_cannot_be_detected(
    saved_payload: Saved, load: Loader
) -> None:
    """A raw payload has no structure of its own: without the recorded digest any byte string is
    a valid payload, so the damaged bytes are restored as they are stored. Backends that keep
    object metadata (local xattrs, object-store user metadata) always carry the digest."""
    damaged = inverted(saved_payload.data, len(saved_payload.data) // 2)
    assert load(damaged, {}).payload == damaged


# ---------------------------------------------------------------------------------------------
# Bugs outside the archive package, kept visible until fixed
# ---------------------------------------------------------------------------------------------


def test_an_object_emptied_after_saving_is_corrupt_not_absent_when_its_size_is_recorded(
    saved: Saved, load: Loader
) -> None:
    assert int(record_of(saved.xattrs)[SIZE_KEY]) > 0
    outcome = load(b"", saved.xattrs)
    assert outcome.error is not None


class _DiskFull:
    """Stands in for the ``os`` module inside ``archive.extract``: creating a file fails with ENOSPC."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def open(path: object, flags: int, mode: int = 0o777) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_full_disk_while_unpacking_is_a_typed_storage_error(
    saved: Saved, load: Loader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive.extract, "os", _DiskFull())
    with pytest.raises(CheckpointStorageError, match="space"):
        load(saved.data, saved.xattrs)
