"""How a parallel load cuts an object into ranged GETs: every connection busy to the end.

The source is an object in memory on fsspec's loop thread, so the tests see exactly which
ranges the reader asks for, in the order it asks (no server, no timing).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import pytest
from fsspec.asyn import get_loop

from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.contract import RangeBody
from flyte_checkpoint.storage.parallel.reader import ParallelReader
from flyte_checkpoint.storage.parallel.sizing import FIRST_RANGE, first_range_size, range_size_for

MiB = 1 << 20


@dataclass
class MemoryBody:
    data: memoryview

    async def readinto(self, b: memoryview, /) -> int:
        count = min(len(b), len(self.data))
        b[:count] = self.data[:count]
        self.data = self.data[count:]
        return count

    async def aclose(self) -> None:
        self.data = memoryview(b"")


@dataclass
class MemorySource:
    """An object held in memory, read by ranges; ``asked`` records each GET as (start, length)."""

    content: bytes
    asked: list[tuple[int, int]] = field(default_factory=list)
    uri: str = "memory://object"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop = get_loop()
        return loop

    def _body(self, start: int, length: int) -> RangeBody:
        self.asked.append((start, length))
        return MemoryBody(memoryview(self.content)[start : start + length])

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        info = ObjectInfo(uri=self.uri, size=len(self.content), version="v1")
        return info, self._body(0, length)

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        assert version == "v1"
        return self._body(start, length)


def read_all(source: MemorySource, settings: TransferSettings) -> bytes:
    reader = ParallelReader.open(source, settings)
    assert reader is not None
    out = bytearray()
    buffer = bytearray(300_000)
    with reader:
        while count := reader.readinto(buffer):
            out += buffer[:count]
    return bytes(out)


def per_connection(asked: list[tuple[int, int]], connections: int) -> list[int]:
    """Bytes each connection carries: range ``i`` reuses the slot of range ``i - connections``
    (ranges are handed out in order, and each handed-out range's slot fetches the next)."""
    carried = [0] * connections
    for index, (_, length) in enumerate(asked):
        carried[index % connections] += length
    return carried


@pytest.mark.parametrize(
    ("size", "part", "connections"),
    [
        (54 * MiB, 8 * MiB, 8),  # less than one round of parts: 7 parts of 8 MiB left one connection idle
        (27 * MiB, 4 * MiB, 4),  # 7 parts of 4 MiB: a second round carried by 3 of the 4 connections
        (215 * MiB + 12345, 8 * MiB, 8),  # 27 parts: a fourth round of 3
    ],
)
def test_every_connection_carries_an_equal_share_to_the_end(size: int, part: int, connections: int) -> None:
    content = os.urandom(size)
    source = MemorySource(content)
    settings = TransferSettings(part_size=part, max_concurrency=connections)

    assert read_all(source, settings) == content

    starts = [start for start, _ in source.asked]
    assert starts == sorted(starts)  # in order, each range once
    assert sum(length for _, length in source.asked) == size
    assert max(length for _, length in source.asked) <= part  # the buffers stay within part_size
    rounds = -(-size // (connections * part))
    carried = per_connection(source.asked, connections)
    assert max(carried) - min(carried) < FIRST_RANGE  # no connection idles while others carry a part
    assert max(carried) <= rounds * -(-size // (connections * rounds))


def test_the_first_get_asks_for_one_mib_and_a_small_object_is_not_cut_smaller() -> None:
    settings = TransferSettings(part_size=8 * MiB, max_concurrency=8)
    assert first_range_size(settings) == FIRST_RANGE == MiB
    assert first_range_size(TransferSettings(part_size=MiB)) == MiB

    small = MemorySource(os.urandom(FIRST_RANGE - 5))
    assert read_all(small, settings) == small.content
    assert small.asked == [(0, FIRST_RANGE)]  # one GET, as long as the first asks

    three = MemorySource(os.urandom(3 * MiB + 1))
    assert read_all(three, settings) == three.content
    assert [length for _, length in three.asked] == [MiB, MiB, MiB, 1]


def test_range_sizes_fill_every_round() -> None:
    settings = TransferSettings(part_size=8 * MiB, max_concurrency=8)
    assert range_size_for(settings, 64 * MiB, MiB) == 8 * MiB  # exactly one round of parts
    assert range_size_for(settings, 54 * MiB, MiB) == -(-54 * MiB // 8)
    assert range_size_for(settings, 65 * MiB, MiB) == -(-65 * MiB // 16)  # two rounds
    assert range_size_for(settings, 0, MiB) == MiB
    assert range_size_for(settings, 2 * MiB, MiB) == MiB  # never shorter than the first GET


def test_an_empty_object_is_one_get() -> None:
    source = MemorySource(b"")
    assert read_all(source, TransferSettings()) == b""
    assert source.asked == [(0, FIRST_RANGE)]
