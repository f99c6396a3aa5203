"""A stream that yields bytes already read from it again, then the rest."""

from __future__ import annotations

import io
from typing import IO


class PrefixedReader(io.RawIOBase):
    """A readable stream that yields ``head`` and then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._head.nbytes:
            count = min(len(view), self._head.nbytes)
            view[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)
