"""Writing an indexed ``.tar.gz``: blocks encoded as gzip members on a pool of threads, in order.

The caller's thread cuts the stream into :data:`~.members.BLOCK`-byte blocks and writes the
finished members to the sink in order; the pool deflates (or stores) blocks meanwhile, outside
the GIL, at most two per thread ahead. A worker never waits on anything but its block, so
abandoning the stream (any exception, an interrupt too) takes at most one block's encoding per
thread: no queue can be left with a count that never reaches zero.

Each member's 8-byte trailer is held back until the next member (or the index) is written, so
a stream abandoned part-way never ends on a member boundary: no gzip reader can take a partial
object for a whole one.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO

from flyte_checkpoint.archive.members import BLOCK, Parts, encode_data, encode_index

THREAD_PREFIX = "flyte-checkpoint-gzip"
"""The name prefix of the encoding threads (tests look for leftovers by it)."""


class MemberWriter:
    """A writable stream that writes an indexed ``.tar.gz`` of what it is given into ``sink``."""

    def __init__(self, sink: IO[bytes], level: int, threads: int) -> None:
        self._sink = sink
        self._level = level
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX)
        self._ahead = 2 * threads
        self._pending: deque[Future[Parts]] = deque()
        self._pieces: deque[bytes | memoryview] = deque()
        self._buffered = 0
        self._entries: list[tuple[int, int]] = []
        self._sizes: deque[int] = deque()
        self._offset = 0
        self._held: bytes | memoryview = b""
        self.closed = False

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Take ``data`` (kept by reference when it is ``bytes``); whole blocks go to the pool."""
        if self.closed:
            raise ValueError("write to a closed archive stream")
        size = len(data)
        if size:
            self._pieces.append(data if isinstance(data, bytes) else bytes(data))
            self._buffered += size
        while self._buffered >= BLOCK:
            self._submit(self._take(BLOCK))
        return size

    def flush(self) -> None:
        """Nothing to do: a member is written only once it is whole."""

    def _take(self, size: int) -> bytes:
        """The first ``size`` buffered bytes, joined: the only copy a stored block costs."""
        parts: list[bytes | memoryview] = []
        need = size
        while need:
            piece = self._pieces.popleft()
            if len(piece) > need:
                view = memoryview(piece)
                parts.append(view[:need])
                self._pieces.appendleft(view[need:])
                need = 0
            else:
                parts.append(piece)
                need -= len(piece)
        self._buffered -= size
        return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)

    def _submit(self, block: bytes) -> None:
        self._pending.append(self._pool.submit(encode_data, block, self._level))
        self._sizes.append(len(block))
        while len(self._pending) > self._ahead:
            self._emit()

    def _emit(self) -> None:
        parts = self._pending.popleft().result()
        length = sum(len(part) for part in parts)
        self._entries.append((length, self._sizes.popleft()))
        if self._held:
            self._sink.write(self._held)
        for part in parts[:-1]:
            self._sink.write(part)
        self._held = parts[-1]  # the trailer
        self._offset += length

    def close(self) -> None:
        """Encode what is left, write every member, then the index and the tail."""
        if self.closed:
            return
        try:
            if self._buffered:
                self._submit(self._take(self._buffered))
            while self._pending:
                self._emit()
            self._sink.write(bytes(self._held) + encode_index(self._entries, self._offset))
        except BaseException:
            self.abandon()
            raise
        self.closed = True
        self._pool.shutdown()

    def abandon(self) -> None:
        """Stop without finishing: nothing more reaches the sink, the pool's threads exit once
        the block each is encoding is done."""
        self.closed = True
        self._held = b""
        self._pieces.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
