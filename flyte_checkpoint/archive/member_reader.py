"""Reading an indexed ``.tar.gz``: members inflated on a pool of threads, read back in order.

The caller's thread reads the object as a stream (so the store's digest still covers every
byte), splits it into members by the lengths their headers declare, hands each data member to
the pool to be checked and inflated, and returns the blocks in order, at most ``threads + 1``
members ahead. A stored member laid out as this package writes one is not copied at all: its
content is handed on as views of the member as read, once the pool has checked its CRC-32. The
extraction that consumes the blocks is the same as the streaming path's, with every safety
check it makes.

Nothing in the object is trusted: each member must inflate to exactly the size it declares,
with its CRC-32; the index members and the tail must agree with the data members actually read
(count, each length, the total, where the index starts), and nothing may follow the tail. A
disagreement raises :class:`~flyte_checkpoint.errors.ArchiveIndexError` naming it; a stream that
stops early raises :class:`~flyte_checkpoint.errors.CheckpointCorruptError`.
"""

from __future__ import annotations

import io
from collections import deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import IO

from flyte_checkpoint.archive import members
from flyte_checkpoint.errors import ArchiveIndexError, CheckpointCorruptError

THREAD_PREFIX = "flyte-checkpoint-gunzip"


class IndexedReader(io.RawIOBase):
    """The content of the indexed archive ``source``, whose first bytes ``head`` were read already.

    Members inflate on ``pool`` when one is given (the caller's to shut down), else on a pool of
    ``threads`` of its own, or on the reading thread when ``threads`` is 1.
    """

    def __init__(self, source: IO[bytes], head: bytes, threads: int, pool: Executor | None = None) -> None:
        self._source = source
        self._head = head
        self._offset = 0
        self._own_pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX)
            if pool is None and threads > 1
            else None
        )
        self._pool = pool or self._own_pool
        self._ahead = threads + 1
        self._pending: deque[Future[bytes | list[memoryview]] | bytes | list[memoryview]] = deque()
        self._pieces: deque[bytes | memoryview] = deque()
        self._seen: list[tuple[int, int]] = []
        self._listed: list[tuple[int, int]] = []
        self._index_offset: int | None = None
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read_view(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (a whole inflated block without copying it when it fits)."""
        data = self.read_view(-1 if size is None else size)
        return data if isinstance(data, bytes) else bytes(data)

    def read_view(self, size: int = -1) -> bytes | memoryview:
        """Up to ``size`` bytes as the archive holds them, without copying: a whole inflated
        block, or a view of one, or of a stored member's content; ``b""`` at the end."""
        while not self._pieces:
            self._fill()
            if not self._pending:
                return b""
            item = self._pending.popleft()
            content = item.result() if isinstance(item, Future) else item
            self._pieces.extend(content if isinstance(content, list) else (content,))
        piece = self._pieces[0]
        if size < 0 or size >= len(piece):
            return self._pieces.popleft()
        view = memoryview(piece)
        self._pieces[0] = view[size:]
        return view[:size]

    def close(self) -> None:
        for item in self._pending:
            if isinstance(item, Future):
                item.cancel()
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._pieces.clear()
        super().close()

    def _fill(self) -> None:
        while not self._done and len(self._pending) < self._ahead:
            self._next_member()

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes, fewer only at the end of the object."""
        parts = []
        if self._head:
            parts.append(self._head[:size])
            self._head = self._head[size:]
            size -= len(parts[0])
        while size > 0 and (data := self._source.read(size)):
            parts.append(data)
            size -= len(data)
        data = b"".join(parts)
        self._offset += len(data)
        return data

    def _read_exact(self, size: int, what: str) -> bytes:
        data = self._read(size)
        if len(data) < size:
            raise CheckpointCorruptError(
                f"damaged archive: it ends at byte {self._offset}, inside {what}: the object is truncated"
            )
        return data

    def _next_member(self) -> None:
        start = self._offset
        head = self._read(members.HEADER_PREFIX)
        if not head:
            raise CheckpointCorruptError(
                f"damaged archive: it ends at byte {start} after {len(self._seen)} data members, "
                "before the end of its index: the object is truncated"
            )
        if len(head) < members.HEADER_PREFIX:
            raise CheckpointCorruptError(
                f"damaged archive: it ends at byte {self._offset}, inside a member header: the "
                "object is truncated"
            )
        frame = members.frame(head, start)
        rest = self._read_exact(frame.length - len(head), f"the member that starts at byte {start}")
        if frame.kind == members.KIND_DATA:
            self._data(rest, start, frame)
            return
        member = head + rest
        members.check_fixed(member, start, frame)
        if frame.kind == members.KIND_INDEX:
            if self._index_offset is None:
                self._index_offset = start
            self._listed.extend(members.decode_index(member, start))
            if len(self._listed) > len(self._seen):
                raise ArchiveIndexError(
                    f"damaged archive: its index lists {len(self._listed)} data members by byte "
                    f"{self._offset}, but it holds {len(self._seen)}"
                )
        else:
            self._tail(member, start)
            self._pending.append(bytes(members.TAIL_CONTENT))

    def _data(self, rest: bytes, start: int, frame: members.Frame) -> None:
        if self._index_offset is not None:
            raise ArchiveIndexError(f"damaged archive: a data member follows the index, at byte {start}")
        declared = members.declared_size(rest, start)
        # Only the last member may be short, so the members too are bounded by the content.
        if self._seen and self._seen[-1][1] != members.BLOCK:
            if self._pending and isinstance(previous := self._pending[-1], Future):
                previous.result()  # a short member that does not even decode: that says more
            raise ArchiveIndexError(
                f"damaged archive: the data member at byte {start} follows one of {self._seen[-1][1]} "
                f"bytes; only the last may be shorter than {members.BLOCK}"
            )
        self._seen.append((frame.length, declared))
        if self._pool is None:
            self._pending.append(members.decode_member(rest, start, frame))
        else:
            self._pending.append(self._pool.submit(members.decode_member, rest, start, frame))

    def _tail(self, member: bytes, start: int) -> None:
        index_offset, count, total = members.decode_tail(member)
        found = start if self._index_offset is None else self._index_offset
        problem = None
        if index_offset != found:
            problem = f"its tail says the index starts at byte {index_offset}, it starts at {found}"
        elif not count == len(self._listed) == len(self._seen):
            problem = (
                f"its tail counts {count} data members and its index lists {len(self._listed)}, "
                f"but it holds {len(self._seen)}"
            )
        elif total != (unpacked := sum(size for _, size in self._seen)):
            problem = f"its tail says it unpacks to {total} bytes, its members to {unpacked}"
        else:
            for number, (listed, seen) in enumerate(zip(self._listed, self._seen, strict=True)):
                if listed != seen:
                    problem = (
                        f"its index lists data member {number} as {listed[0]} bytes unpacking to "
                        f"{listed[1]}, but it is {seen[0]} bytes unpacking to {seen[1]}"
                    )
                    break
        if problem is None and self._read(1):
            problem = f"bytes follow its tail member (at byte {self._offset - 1})"
        if problem is not None:
            raise ArchiveIndexError(f"damaged archive: {problem}")
        self._done = True
