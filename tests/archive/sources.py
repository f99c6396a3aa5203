"""An in-memory object that offers reads at offsets as a local file does
(:mod:`flyte_checkpoint.archive.positional`), and checks that a reader accounts for every byte
in order with its true CRC-32."""

from __future__ import annotations

import io
import threading
import zlib


class ReadableAtOffsets(io.BytesIO):
    """``data`` as a stream that can also be read at offsets; records who read what."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.data = data
        self.crc = 0
        self.read_in_order = 0
        self.read_at_by_thread: dict[str, int] = {}
        self.reserved = 0

    def positional_reads(self) -> ReadableAtOffsets:
        return self

    def consumed(self) -> int:
        return self.tell()

    def size(self) -> int:
        return len(self.data)

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.read_in_order += len(data)
        self.crc = zlib.crc32(data, self.crc)
        return data

    def read_at(self, offset: int, size: int) -> bytes:
        data = self.data[offset : offset + size]
        name = threading.current_thread().name
        self.read_at_by_thread[name] = self.read_at_by_thread.get(name, 0) + len(data)
        return data

    def reserve(self, length: int) -> None:
        self.reserved += length

    def skip(self, length: int, crc: int) -> None:
        skipped = self.data[self.tell() : self.tell() + length]
        assert len(skipped) == length, "skipped past the end"
        assert self.tell() + length <= self.read_in_order + self.reserved, "skipped before it was reserved"
        assert crc == zlib.crc32(skipped), f"wrong CRC-32 for the {length} bytes at {self.tell()}"
        self.crc = zlib.crc32(skipped, self.crc)
        self.seek(length, io.SEEK_CUR)

    @property
    def accounted_for(self) -> bool:
        """Whether every byte was read, or reserved and skipped, in order, with the right CRC-32."""
        whole = self.tell() == len(self.data) == self.read_in_order + self.reserved
        return whole and self.crc == zlib.crc32(self.data)
