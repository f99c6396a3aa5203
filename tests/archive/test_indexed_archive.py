"""Indexed archives: independent gzip members, stored where deflate saves nothing, an index, and
parallel loads that check everything the streaming load checks and the index besides."""

from __future__ import annotations

import gzip
import io
import os
import random
import struct
import subprocess
import tarfile
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from isal import igzip_threaded

from flyte_checkpoint import ArchiveIndexError, CheckpointCorruptError, ConfigurationError, archive
from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.compression import THREADS_ENV, compression_threads
from flyte_checkpoint.cpu_quota import usable_cpus
from tests.archive.sources import ReadableAtOffsets

TEXT = b"".join(b"step %d loss %.6f lr 0.0003 tokens/s 12345\n" % (i, 1 / (i + 1)) for i in range(120_000))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "model.bin").write_bytes(os.urandom(3 * members.BLOCK + 12345))
    (root / "log.txt").write_bytes(TEXT)
    (root / "empty").write_bytes(b"")
    return root


def packed(tree: Path, **options: int) -> bytes:
    sink = io.BytesIO()
    archive.pack_directory(tree, sink, **options)
    return sink.getvalue()


def contents(root: Path) -> dict[str, bytes | None]:
    return {
        str(path.relative_to(root)): path.read_bytes() if path.is_file() else None
        for path in sorted(root.rglob("*"))
    }


def unpacked(data: bytes, dest: Path, threads: int = 2) -> dict[str, bytes | None]:
    archive.unpack_archive(io.BytesIO(data), dest, threads=threads)
    return contents(dest)


def split_members(data: bytes) -> list[tuple[int, members.Frame]]:
    found, offset = [], 0
    while offset < len(data):
        frame = members.frame(data[offset : offset + members.HEADER_PREFIX], offset)
        found.append((offset, frame))
        offset += frame.length
    return found


def test_random_blocks_are_stored_and_text_blocks_deflated() -> None:
    random_block, text_block = os.urandom(members.BLOCK), TEXT[: members.BLOCK]
    assert not members.worth_compressing(random_block, 1)
    assert members.worth_compressing(text_block, 1)
    stored = b"".join(members.encode_data(random_block, 1))
    body = stored[len(stored) - members.BLOCK - 8 - 5 * 17 :]
    assert body[0] & 0b110 == 0  # BTYPE 00: a stored deflate block
    assert struct.unpack_from("<HH", body, 1) == (0xFFFF, 0)
    assert len(b"".join(members.encode_data(text_block, 1))) < members.BLOCK // 3


def test_a_block_is_judged_by_its_last_16_kib_as_well_as_its_first_and_middle() -> None:
    block = os.urandom(members.BLOCK - 20_000) + TEXT[:20_000]
    deflated = b"".join(members.encode_data(block, 1))
    assert len(deflated) < members.BLOCK - 10_000  # the text tail shrank: it was not stored


def test_a_stored_member_of_ours_is_read_as_checked_views_of_itself_without_a_copy() -> None:
    block = os.urandom(members.BLOCK - 777)
    member = b"".join(members.encode_data(block, 1))
    frame = members.frame(member[: members.HEADER_PREFIX], 0)
    rest = member[members.HEADER_PREFIX :]
    views = members.stored_content(rest, 0, frame)
    assert views is not None
    assert all(view.obj is rest for view in views)
    assert b"".join(views) == block
    damaged = rest[:-20] + bytes([rest[-20] ^ 1]) + rest[-19:]
    with pytest.raises(ArchiveIndexError, match="fails its CRC-32"):
        members.stored_content(damaged, 0, frame)


def test_an_incompressible_tree_costs_no_more_than_its_size_and_text_compresses(tree: Path) -> None:
    data = packed(tree)
    weights = (tree / "weights" / "model.bin").stat().st_size
    assert weights < len(data) < weights + len(TEXT) // 3  # stored weights, deflated text
    assert len(data) < len(packed(tree, level=0))


def log_lines(number: int, rng: random.Random) -> bytes:
    """A training log as the benchmark's: structured lines, each with 8 random hex digits."""
    return b"".join(
        f"{number:02d} step={step} loss={1 / (step + 1):.6f} lr=3e-4 grad_norm={(step % 97) / 13:.4f} "
        f"tokens_per_s={12000 + step % 517} note=checkpoint {rng.getrandbits(32):08x}\n".encode()
        for step in range(9000)
    )


def test_training_logs_pack_smaller_than_the_single_stream_saves_wrote_before(tmp_path: Path) -> None:
    rng = random.Random(31)
    for number in range(8):
        (tmp_path / f"log-{number}.txt").write_bytes(log_lines(number, rng))
    ours = packed(tmp_path)
    single_stream = io.BytesIO()
    opener: Any = igzip_threaded.open  # untyped; the writer saves used before the indexed layout
    with opener(single_stream, "wb", compresslevel=1, threads=2) as out:
        out.write(gzip.decompress(ours))
    assert len(ours) < len(single_stream.getvalue())


def test_an_object_is_independent_members_ending_in_an_index_and_a_tail(tree: Path) -> None:
    data = packed(tree)
    found = split_members(data)
    kinds = [frame.kind for _, frame in found]
    assert kinds[-1] == members.KIND_TAIL
    assert kinds[-2] == members.KIND_INDEX
    assert found[-1][1].length == members.TAIL_SIZE
    index_offset, count, total = members.decode_tail(data[-members.TAIL_SIZE :])
    assert index_offset == found[-2][0]
    assert count == kinds.count(members.KIND_DATA) >= 4
    plain = gzip.decompress(data)
    assert total + members.TAIL_CONTENT == len(plain)
    for offset, frame in found[:count]:  # each member is a gzip file on its own
        gzip.decompress(data[offset : offset + frame.length])


def extracted_by_tar(data: bytes, where: Path) -> Path:
    """``data`` saved as ``where/object.tar.gz`` and unpacked by ``tar -xzf`` into ``where/by-tar``."""
    (where / "object.tar.gz").write_bytes(data)
    (out := where / "by-tar").mkdir()
    subprocess.run(["tar", "-xzf", str(where / "object.tar.gz"), "-C", str(out)], check=True)
    return out


def test_standard_readers_and_tar_read_the_new_objects(tree: Path, tmp_path: Path) -> None:
    data = packed(tree)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as opened:
        assert sorted(opened.getnames()) == ["empty", "log.txt", "weights", "weights/model.bin"]
    assert contents(extracted_by_tar(data, tmp_path)) == contents(tree)


def test_files_of_every_size_around_the_block_and_stored_block_edges_read_back_by_tar(tmp_path: Path) -> None:
    root = tmp_path / "edges"
    root.mkdir()
    sizes = [0, 1, 65_534, 65_535, 65_536, members.BLOCK - 1, members.BLOCK, members.BLOCK + 1]
    sizes += [2 * members.BLOCK + 65_535 * 3 + 7, 3 * members.BLOCK - 511]
    for number, size in enumerate(sizes):
        (root / f"random-{number}").write_bytes(os.urandom(size))
        (root / f"text-{number}").write_bytes((TEXT * (size // len(TEXT) + 1))[:size])
    data = packed(root, threads=3)
    assert contents(extracted_by_tar(data, tmp_path)) == contents(root)
    assert unpacked(data, tmp_path / "ours") == contents(root)


def test_a_parallel_load_equals_the_streaming_load(tree: Path, tmp_path: Path) -> None:
    data = packed(tree)
    plain = gzip.decompress(data)
    archive.unpack_archive(io.BytesIO(plain), tmp_path / "streamed", compressed=False)
    expected = contents(tmp_path / "streamed")
    assert expected == contents(tree)
    assert unpacked(data, tmp_path / "one", threads=1) == expected
    assert unpacked(data, tmp_path / "four", threads=4) == expected


def test_single_stream_objects_of_other_tools_and_older_versions_load(tree: Path, tmp_path: Path) -> None:
    plain = gzip.decompress(packed(tree))
    old = gzip.compress(plain)  # one gzip member, no index: what earlier versions and tar wrote
    assert not members.is_indexed(old[: members.HEADER_PREFIX])
    assert unpacked(old, tmp_path / "old") == contents(tree)


Opener = Callable[[bytes], IO[bytes]]


@pytest.fixture(params=["read in order", "read at offsets"])
def opened(request: pytest.FixtureRequest) -> Opener:
    """How the load reads the object: a plain stream, or one it can read at offsets too (as a
    local file), so every refusal holds for members read on the pool as well."""
    return io.BytesIO if request.param == "read in order" else ReadableAtOffsets


def test_a_source_readable_at_offsets_is_read_there_on_the_pool_and_accounted_in_order(
    tree: Path, tmp_path: Path
) -> None:
    data = packed(tree)
    found = split_members(data)
    index_offset, count, _ = members.decode_tail(data[-members.TAIL_SIZE :])
    source = ReadableAtOffsets(data)
    archive.unpack_archive(source, tmp_path / "out", threads=2)
    assert contents(tmp_path / "out") == contents(tree)
    assert source.accounted_for
    assert source.read_in_order <= found[1][0] + 1  # the first member, then the end
    # This thread read at offsets at most the headers of the members after the first, and the
    # index and the tail members whole, twice (first to plan the load, then in order to check
    # them against the members read); the pool read the rest of every member after the first.
    headers, index_and_tail = (count + 1) * members.DATA_HEADER, len(data) - index_offset
    assert source.read_at_by_thread.pop(threading.current_thread().name) <= headers + 2 * index_and_tail
    bodies = index_offset - found[1][0] - (count - 1) * members.HEADER_PREFIX
    assert sum(source.read_at_by_thread.values()) >= bodies
    assert all(name.startswith("flyte-checkpoint") for name in source.read_at_by_thread)


def test_a_truncated_object_is_refused_at_every_kind_of_cut(
    tree: Path, tmp_path: Path, opened: Opener
) -> None:
    data = packed(tree)
    found = split_members(data)
    index_offset = members.decode_tail(data[-members.TAIL_SIZE :])[0]
    cuts = {
        index_offset: "before the end of its index",
        found[1][0] + 100: "inside",
        found[-1][0]: "before the end of its index",
        len(data) - 3: "inside",
        found[1][0] + 5: "inside a member header",
    }
    for number, (cut, message) in enumerate(cuts.items()):
        with pytest.raises(CheckpointCorruptError, match=message):
            archive.unpack_archive(opened(data[:cut]), tmp_path / f"cut{number}", threads=2)


def rewritten(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def test_a_tampered_index_is_refused_naming_what_disagrees(
    tree: Path, tmp_path: Path, opened: Opener
) -> None:
    data = packed(tree)
    index_offset, count, total = members.decode_tail(data[-members.TAIL_SIZE :])
    first_entry = index_offset + members.HEADER_PREFIX + 4
    tail_fields = len(data) - members.TAIL_SIZE + members.HEADER_PREFIX
    cases = {
        "lists data member 0 as": rewritten(data, first_entry + 4, struct.pack("<I", 7)),
        "tail counts": rewritten(data, tail_fields + 8, struct.pack("<Q", count + 1)),
        "unpacks to": rewritten(data, tail_fields + 16, struct.pack("<Q", total - 1)),
        "index starts at byte": rewritten(data, tail_fields, struct.pack("<Q", index_offset - 1)),
        "follow its tail": data + b"\x00",
    }
    for number, (message, tampered) in enumerate(cases.items()):
        with pytest.raises(ArchiveIndexError, match=message):
            archive.unpack_archive(opened(tampered), tmp_path / f"case{number}", threads=2)


@pytest.mark.parametrize("member", [0, 1], ids=["the first member", "a later member"])
def test_a_data_member_that_lies_about_its_size_or_content_is_refused(
    tree: Path, tmp_path: Path, opened: Opener, member: int
) -> None:
    data = packed(tree)
    start, frame = split_members(data)[member]
    declared_at = start + members.HEADER_PREFIX
    lying = rewritten(data, declared_at, struct.pack("<I", members.BLOCK - 1))
    # Read at offsets, the index is read first, and the member is found to disagree with it.
    with pytest.raises(ArchiveIndexError, match=f"exactly the|but the member there is {frame.length} bytes"):
        archive.unpack_archive(opened(lying), tmp_path / "size", threads=2)
    length_at = start + members.HEADER_PREFIX - 4
    too_long = rewritten(data, length_at, struct.pack("<I", 4 * members.BLOCK))
    with pytest.raises(ArchiveIndexError, match="declares a length"):
        archive.unpack_archive(opened(too_long), tmp_path / "length", threads=2)
    end = start + frame.length
    flipped = rewritten(data, end - 20, bytes([data[end - 20] ^ 0xFF]))
    with pytest.raises(
        ArchiveIndexError, match=rf"data member at byte {start} (fails its CRC|does not inflate)"
    ):
        archive.unpack_archive(opened(flipped), tmp_path / "crc", threads=2)


def stored_in_small_blocks(block: bytes) -> bytes:
    """A data member of ``block`` as stored deflate blocks of 1,000 bytes: valid, but not laid
    out as this package writes stored members (65,535 bytes per block)."""
    deflater = zlib.compressobj(0, zlib.DEFLATED, -15)
    body = b"".join(
        deflater.compress(block[at : at + 1000]) + deflater.flush(zlib.Z_FULL_FLUSH)
        for at in range(0, len(block), 1000)
    )
    body += deflater.flush()
    trailer = struct.pack("<II", zlib.crc32(block), len(block))
    header = members._header(members.KIND_DATA, struct.pack("<I", len(block)), len(body) + len(trailer))
    return header + body + trailer


def test_a_stored_member_laid_out_by_another_writer_is_inflated_and_checked(tmp_path: Path) -> None:
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT) as tar:
        content = os.urandom(300_000)
        info = tarfile.TarInfo("weights.bin")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    stream = plain.getvalue()
    blocks = [stream[at : at + members.BLOCK] for at in range(0, len(stream), members.BLOCK)]
    encoded = [stored_in_small_blocks(block) for block in blocks]
    data = b"".join(encoded)
    data += members.encode_index([(len(m), len(b)) for m, b in zip(encoded, blocks, strict=True)], len(data))
    assert unpacked(data, tmp_path / "restored") == {"weights.bin": content}
    flipped = bytearray(data)
    flipped[len(encoded[0]) // 2] ^= 0xFF
    with pytest.raises(ArchiveIndexError, match=r"data member at byte 0 (fails its CRC|does not inflate)"):
        archive.unpack_archive(io.BytesIO(bytes(flipped)), tmp_path / "flipped")


def test_the_zlib_fallback_writes_the_same_layout(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(members, "_isal_zlib", None)
    data = packed(tree)
    assert split_members(data)[-1][1].kind == members.KIND_TAIL
    assert unpacked(data, tmp_path / "zlib") == contents(tree)


def test_threads_default_to_the_usable_cores_and_are_settable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert compression_threads() == usable_cpus()  # the cores, within a container's CPU limit
    monkeypatch.setenv(THREADS_ENV, "3")
    assert compression_threads() == 3
    assert compression_threads(1) == 1
    for wrong in ("0", "many", "-2", "1.5"):
        monkeypatch.setenv(THREADS_ENV, wrong)
        with pytest.raises(ConfigurationError, match=THREADS_ENV):
            compression_threads()
    with pytest.raises(ConfigurationError, match="1 to 1024"):
        compression_threads(0)
