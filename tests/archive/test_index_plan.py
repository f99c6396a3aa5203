"""The plan a load reads from an indexed archive's index before its members (local disk)."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

from flyte_checkpoint import archive
from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.index_plan import read_plan
from tests.archive.sources import ReadableAtOffsets

MIB = 1 << 20


def packed(tmp_path: Path, mib: int = 5) -> bytes:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "weights.bin").write_bytes(os.urandom(mib * MIB))
    (tree / "log.txt").write_bytes(b"step 1 loss 0.5\n" * 100_000)
    sink = io.BytesIO()
    archive.pack_directory(tree, sink)
    return sink.getvalue()


def data_members(data: bytes) -> list[tuple[int, int, int]]:
    """(start, length, declared) of each data member, found by walking the members' headers."""
    found, offset = [], 0
    while offset < len(data):
        frame = members.frame(data[offset : offset + members.HEADER_PREFIX], offset)
        if frame.kind == members.KIND_DATA:
            rest = data[offset + members.HEADER_PREFIX : offset + members.DATA_HEADER]
            found.append((offset, frame.length, members.declared_size(rest, offset)))
        offset += frame.length
    return found


class RecordingReads(ReadableAtOffsets):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[int] = []

    def read_at(self, offset: int, size: int) -> bytes:
        self.reads.append(size)
        return super().read_at(offset, size)


def with_tail(data: bytes, field: int, value: int) -> bytes:
    """``data`` with the tail's ``field`` (0: where the index starts, 8: members, 16: content)."""
    changed = bytearray(data)
    struct.pack_into("<Q", changed, len(data) - members.TAIL_SIZE + members.HEADER_PREFIX + field, value)
    return bytes(changed)


def test_the_plan_lists_every_data_member_where_it_starts(tmp_path: Path) -> None:
    data = packed(tmp_path)
    plan = read_plan(ReadableAtOffsets(data))
    assert plan is not None
    planned = [plan.member(number) for number in range(len(plan))]
    assert [(p.start, p.length, p.declared) for p in planned] == data_members(data)
    assert [plan.at(start) for start, _, _ in data_members(data)] == list(range(len(plan)))
    assert plan.at(1) is None


def test_a_truncated_object_has_no_plan(tmp_path: Path) -> None:
    data = packed(tmp_path)
    assert read_plan(ReadableAtOffsets(data[:-1])) is None


def test_a_tail_counting_members_its_content_does_not_fill_has_no_plan(tmp_path: Path) -> None:
    data = packed(tmp_path)
    count = members.decode_tail(data[-members.TAIL_SIZE :])[1]
    assert read_plan(ReadableAtOffsets(with_tail(data, 8, count + 1))) is None


def test_an_index_a_hostile_tail_says_is_huge_is_never_read(tmp_path: Path) -> None:
    # Two to the forty members of a block each: the bytes before the index could not hold them,
    # so nothing past the tail is read, let alone decoded.
    data = with_tail(with_tail(packed(tmp_path), 8, 1 << 40), 16, (1 << 40) * members.BLOCK)
    source = RecordingReads(data)
    assert read_plan(source) is None
    assert source.reads == [members.TAIL_SIZE]


def test_an_index_listing_a_short_member_before_the_last_has_no_plan(tmp_path: Path) -> None:
    data = bytearray(packed(tmp_path))
    index_at = members.decode_tail(bytes(data[-members.TAIL_SIZE :]))[0]
    first_entry = index_at + members.HEADER_PREFIX + 4
    struct.pack_into("<I", data, first_entry + 4, members.BLOCK - 1)
    assert read_plan(ReadableAtOffsets(bytes(data))) is None
