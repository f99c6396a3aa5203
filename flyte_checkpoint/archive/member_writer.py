"""Writing an indexed ``.tar.gz``: blocks encoded as gzip members on a pool of threads, in order.

The caller's thread cuts the stream into :data:`~.members.BLOCK`-byte blocks and writes the
finished members to the sink in order; the pool deflates (or stores) blocks meanwhile, outside
the GIL, at most two per thread ahead. A worker never waits on anything but its block, so
abandoning the stream (any exception, an interrupt too) takes at most one block's encoding per
thread: no queue can be left with a count that never reaches zero.

A large file's content is not read by the caller's thread: :meth:`MemberWriter.write_file`
takes its descriptor, and each block's worker reads its own range of it with ``preadv``. The
caller's thread then only writes members to the sink, so a save reads on as many cores as it
encodes on. A block is read straight into a reused buffer laid out as stored deflate blocks, so
a stored member is written from that buffer with no copy at all (a deflated one costs the one
copy that joins the content for deflate). The buffer is reused once its member is written: the
sink's ``write()`` must not keep what it is given after it returns, which is the contract of
:mod:`io`'s ``write()`` (and every store writer of this package keeps to it).

Each member's 8-byte trailer is held back until the next member (or the index) is written, so
a stream abandoned part-way never ends on a member boundary: no gzip reader can take a partial
object for a whole one.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from flyte_checkpoint.archive.members import (
    BLOCK,
    Parts,
    encode_index,
    encode_laid_out,
    laid_out_size,
    past,
    place,
    spans,
)
from flyte_checkpoint.errors import InputChangedError

OPEN_FILES = 64
"""Files whose ranges are still to be read, kept open at most, before the oldest block is written."""

THREAD_PREFIX = "flyte-checkpoint-gzip"
"""The name prefix of the encoding threads (tests look for leftovers by it)."""


@dataclass(eq=False)
class SourceFile:
    """An open file whose content is read on the pool: its descriptor, path and listed size."""

    fd: int
    path: str
    size: int
    last_block: int = 0
    """The number (from 1) of the block that reads the file's end, once that block is cut."""
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


@dataclass(frozen=True)
class FileRange:
    """``length`` bytes of ``file`` from ``offset``: part of a block, read by its worker."""

    file: SourceFile
    offset: int
    length: int

    def __len__(self) -> int:
        return self.length

    def split(self, size: int) -> tuple[FileRange, FileRange]:
        return (
            FileRange(self.file, self.offset, size),
            FileRange(self.file, self.offset + size, self.length - size),
        )

    def read_into(self, views: list[memoryview]) -> None:
        """Fill ``views`` (``length`` bytes in all, in order) with the range; a file that no
        longer holds all of it shrank while it was saved."""
        done = 0
        while views:
            got = _pread_into(self.file.fd, views, self.offset + done)
            if not got:
                raise shrank(self.file.path, self.file.size, self.offset + done)
            done += got
            views = past(views, got)


def _pread_into(fd: int, views: list[memoryview], offset: int) -> int:
    if hasattr(os, "preadv"):
        return os.preadv(fd, views, offset)  # one call fills every view
    data = os.pread(fd, len(views[0]), offset)  # pragma: no cover - platforms without preadv
    views[0][: len(data)] = data
    return len(data)


def shrank(path: str, listed: int, found: int) -> InputChangedError:
    """The error for a file listed at ``listed`` bytes that held only ``found`` when read.

    A file that grows is stored with the size it had when listed (as tar does); one that
    shrinks cannot fill the size its header already declared."""
    return InputChangedError(
        f"{path} shrank from {listed} to {found} bytes while it was being saved, so the save was "
        "abandoned; write new files and rename them, or save when nothing writes"
    )


Segment = bytes | memoryview | FileRange
"""Part of the tar stream as given: bytes, or a range of a file still to be read."""


def _encode(segments: list[Segment], level: int, spare: deque[bytearray]) -> tuple[Parts, bytearray]:
    """Read ``segments`` into a block buffer (one of ``spare`` when there is one), laid out so
    that a stored member is the buffer itself, and encode it.

    A stored member's body is a view of the buffer, so the buffer is handed back with the
    parts, to be returned to ``spare`` once they are written. Reusing buffers matters: a fresh
    MiB per block costs more in page faults than its copy."""
    try:
        buffer = spare.pop()
    except IndexError:  # none spare (checked by trying: another worker may take the last one)
        buffer = bytearray(BUFFER_SIZE)
    view = memoryview(buffer)
    size = sum(len(segment) for segment in segments)
    at = 0
    for segment in segments:
        if isinstance(segment, FileRange):
            segment.read_into([span for span, _ in spans(view, size, at, len(segment))])
        else:
            place(view, size, at, segment)
        at += len(segment)
    return encode_laid_out(view, size, level), buffer


BUFFER_SIZE = laid_out_size(BLOCK)


class MemberWriter:
    """A writable stream that writes an indexed ``.tar.gz`` of what it is given into ``sink``."""

    def __init__(self, sink: IO[bytes], level: int, threads: int) -> None:
        self._sink = sink
        self._level = level
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX)
        self._ahead = 2 * threads
        self._pending: deque[Future[tuple[Parts, bytearray]]] = deque()
        self._spare: deque[bytearray] = deque()  # block buffers whose members are written
        self._pieces: deque[Segment] = deque()
        self._files: deque[SourceFile] = deque()
        self._submitted = 0
        self._emitted = 0
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
        self._submit_whole_blocks()
        return size

    def write_file(self, fd: int, path: str, size: int) -> None:
        """Take the open file ``fd`` (``path``, listed at ``size`` bytes; closed by this writer
        whatever happens) and write its first ``size`` bytes, read on the pool as blocks are
        encoded. One that turns out shorter raises :class:`~flyte_checkpoint.errors.InputChangedError`
        from a later call, by :meth:`close` at the latest."""
        file = SourceFile(fd, path, size)
        if self.closed:
            file.close()
            raise ValueError("write to a closed archive stream")
        if not size:
            file.close()
            return
        self._files.append(file)
        self._pieces.append(FileRange(file, 0, size))
        self._buffered += size
        self._submit_whole_blocks()
        while len(self._files) > OPEN_FILES and self._pending:
            self._emit()  # with many threads, blocks in flight could hold more files than may be open

    def flush(self) -> None:
        """Nothing to do: a member is written only once it is whole."""

    def _submit_whole_blocks(self) -> None:
        while self._buffered >= BLOCK:
            self._submit(self._take(BLOCK))

    def _take(self, size: int) -> list[Segment]:
        """The first ``size`` buffered bytes, as the segments that hold them."""
        segments: list[Segment] = []
        need = size
        while need:
            piece = self._pieces.popleft()
            if len(piece) > need:
                if isinstance(piece, FileRange):
                    head, rest = piece.split(need)
                    segments.append(head)
                    self._pieces.appendleft(rest)
                else:
                    view = memoryview(piece)
                    segments.append(view[:need])
                    self._pieces.appendleft(view[need:])
                need = 0
            else:
                segments.append(piece)
                need -= len(piece)
        self._buffered -= size
        return segments

    def _submit(self, segments: list[Segment]) -> None:
        self._pending.append(self._pool.submit(_encode, segments, self._level, self._spare))
        self._sizes.append(sum(len(segment) for segment in segments))
        self._submitted += 1
        self._note_last_reads(segments)
        while len(self._pending) > self._ahead:
            self._emit()

    def _note_last_reads(self, segments: list[Segment]) -> None:
        """Number the files whose last range is in the block just submitted with that block:
        a descriptor is closed once the member of the block that reads its end is written."""
        for segment in segments:
            if isinstance(segment, FileRange) and segment.offset + segment.length == segment.file.size:
                segment.file.last_block = self._submitted

    def _close_read_files(self) -> None:
        while self._files and 0 < self._files[0].last_block <= self._emitted:
            self._files.popleft().close()

    def _emit(self) -> None:
        parts, buffer = self._pending.popleft().result()
        self._emitted += 1
        self._close_read_files()
        length = sum(len(part) for part in parts)
        self._entries.append((length, self._sizes.popleft()))
        if self._held:
            self._sink.write(self._held)
        for part in parts[:-1]:
            self._sink.write(part)
        # The sink is done with it: io's write() contract lets the caller reuse what it passed.
        self._spare.append(buffer)
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
        self._close_files()
        self._spare.clear()

    def abandon(self) -> None:
        """Stop without finishing: nothing more reaches the sink, the pool's threads exit once
        the block each is encoding is done."""
        self.closed = True
        self._held = b""
        self._pieces.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._close_files()  # only now: no worker is still reading one
        self._spare.clear()

    def _close_files(self) -> None:
        while self._files:
            self._files.popleft().close()
