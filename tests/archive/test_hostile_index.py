"""Hostile indexed archives, built member by member: each is refused at once, keeping nothing per
member it declares, with :class:`ArchiveIndexError` naming what is wrong."""

from __future__ import annotations

import io
import struct
import time
from pathlib import Path

import pytest

from flyte_checkpoint import ArchiveIndexError
from flyte_checkpoint.archive import members, unpack_archive
from tests.archive.sources import ReadableAtOffsets

END_OF_TAR = bytes(1024)


def member(block: bytes) -> bytes:
    return b"".join(bytes(part) for part in members.encode_data(block, 0))


def indexed(blocks: list[bytes]) -> bytes:
    """An indexed archive of ``blocks`` as data members, with an index that agrees with them."""
    encoded = [member(block) for block in blocks]
    data = b"".join(encoded)
    entries = [(len(one), len(block)) for one, block in zip(encoded, blocks, strict=True)]
    return data + members.encode_index(entries, len(data))


def refused(data: bytes, dest: Path, message: str) -> None:
    """Refused read in order, and read at offsets (where the index is read first)."""
    for number, source in enumerate((io.BytesIO(data), ReadableAtOffsets(data))):
        started = time.monotonic()
        with pytest.raises(ArchiveIndexError, match=message):
            unpack_archive(source, dest / str(number), threads=2)
        assert time.monotonic() - started < 2


def test_an_archive_of_empty_data_members_is_refused_at_the_first(tmp_path: Path) -> None:
    # A million of them (45 MiB) used to load as an empty tree after 20 s and 100 MiB of bookkeeping.
    data = indexed([b""] * 1000 + [END_OF_TAR])
    refused(data, tmp_path / "out", "data member at byte 0 declares no content")


def test_a_data_member_after_a_short_one_is_refused(tmp_path: Path) -> None:
    data = indexed([END_OF_TAR[:512], END_OF_TAR[512:]])
    refused(data, tmp_path / "out", "follows one of 512 bytes; only the last may be shorter")


def test_an_index_listing_more_members_than_were_read_is_refused_before_the_tail(tmp_path: Path) -> None:
    body = member(END_OF_TAR)
    entries = [(len(body), len(END_OF_TAR))] * (members.INDEX_ENTRIES * 4)
    data = body + members.encode_index(entries, len(body))
    refused(data, tmp_path / "out", f"index lists {members.INDEX_ENTRIES} data members by byte")


TAIL_FIELDS = [(0, "index starts at byte"), (8, "tail counts"), (16, "unpacks to")]


@pytest.mark.parametrize(("field", "message"), TAIL_FIELDS)
def test_a_tail_declaring_two_to_the_forty_is_refused(tmp_path: Path, field: int, message: str) -> None:
    data = bytearray(indexed([END_OF_TAR]))
    struct.pack_into("<Q", data, len(data) - members.TAIL_SIZE + members.HEADER_PREFIX + field, 1 << 40)
    refused(bytes(data), tmp_path / "out", message)


def test_a_data_member_declaring_more_than_a_block_is_refused_before_inflating(tmp_path: Path) -> None:
    data = bytearray(indexed([END_OF_TAR]))
    struct.pack_into("<I", data, members.HEADER_PREFIX, 1 << 31)
    refused(bytes(data), tmp_path / "out", f"declares {1 << 31} bytes, over {members.BLOCK}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", [members.KIND_DATA, members.KIND_INDEX, members.KIND_TAIL])
@pytest.mark.parametrize("subfield", [0, 2, 6])
def test_a_member_whose_extra_field_cannot_hold_its_kinds_fields_is_refused(
    tmp_path: Path, kind: int, subfield: int, threads: int
) -> None:
    # The FC subfield says it has `subfield` bytes, too few for the version, kind and length and
    # the kind's own fields, though the bytes that would hold them follow: such a member used to
    # escape as a bare IndexError or struct.error instead of a damaged archive.
    length = 26
    fixed = struct.pack("<2sBBIBBH", b"\x1f\x8b", 8, 4, 0, 0, 255, 4 + subfield)
    common = struct.pack("<BBI", members.VERSION, kind, length)
    member = (fixed + struct.pack("<2sH", b"FC", subfield) + common + b"\x03\x00" + bytes(8))[:length]
    with pytest.raises(ArchiveIndexError, match="cannot hold the fields its kind has"):
        unpack_archive(io.BytesIO(member + bytes(100)), tmp_path / "out", threads=threads)
