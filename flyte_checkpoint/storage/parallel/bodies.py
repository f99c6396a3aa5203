"""Upload parts as file-like bodies: a view of a buffer, or a range of a regular file read as it is sent."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from flyte_checkpoint.errors import InputChangedError
from flyte_checkpoint.storage.digests import crc32

T = TypeVar("T")


class PartBody(io.RawIOBase):
    """One upload part as a read-only, seekable file: what botocore, aiohttp and the Azure SDK stream.

    Given ``bytes``, aiohttp on Python < 3.12.9 joins the headers and the whole body into one
    new ``bytes`` and the event loop's transport copies what the socket does not take at once:
    two more copies of every part. A file-like body is sent in reads of up to 256 KiB, so a
    part in flight costs its source and one chunk. aiohttp sends from the body's position, so
    every try of a part starts with :meth:`rewind`.

    A body read from a file keeps the CRC32 of its last pass from its start to its end: the
    bytes that went out (clients may read a body more than once, to sign it, say, and rewind).
    Reads run on the client's threads; a read that a failed try left running and that ends
    after the next try began is ignored, so it cannot move the new pass.
    """

    keeps_crc: ClassVar[bool] = False

    def __init__(self, length: int) -> None:
        super().__init__()
        self._length = length
        self._lock = threading.Lock()
        self._pass = 0
        """Counts rewinds to the start: a read that began in an earlier pass is ignored."""
        self._position = 0
        self._crc = 0
        self._crc_end = 0
        """How far the current pass from the start has been read (and digested) contiguously."""
        self.failure: BaseException | None = None
        """The error a read of the source raised, which the HTTP client may have reported as a
        connection error; the part layer raises this instead (see :meth:`ParallelWriter._send_part`)."""

    def __len__(self) -> int:
        return self._length

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence]
        with self._lock:
            self._position = max(0, base + offset)
            if self._position == 0:
                self._pass += 1
                self._crc = self._crc_end = 0
            return self._position

    def rewind(self) -> None:
        """Back to the start, for a new try of the part."""
        self.seek(0)

    def readinto(self, buffer: Any) -> int:
        with self._lock:
            started, position = self._pass, self._position
        with memoryview(buffer) as given, given.cast("B") as target:
            wanted = max(0, min(len(target), self._length - position))
            count = self._guarded(lambda: self._fill(position, target[:wanted])) if wanted else 0
            self._advance(started, position, target[:count])
        return count

    def read(self, size: int = -1) -> bytes:
        with self._lock:
            started, position = self._pass, self._position
        remaining = max(0, self._length - position)
        wanted = remaining if size is None or size < 0 else min(size, remaining)
        chunk = self._guarded(lambda: self._take(position, wanted)) if wanted else b""
        self._advance(started, position, chunk)
        return chunk

    def _guarded(self, read: Callable[[], T]) -> T:
        try:
            return read()
        except BaseException as exc:
            self.failure = exc
            raise

    def _advance(self, started: int, position: int, data: bytes | memoryview) -> None:
        """Move past ``data``, read from ``position``, unless a rewind came in between."""
        with self._lock:
            if started != self._pass or position != self._position:
                return  # a read of an earlier try that ended late
            if self.keeps_crc and position == self._crc_end:
                self._crc = crc32(data, self._crc)
                self._crc_end += len(data)
            self._position += len(data)

    def sent_crc(self) -> int | None:
        """The CRC32 of the last whole pass over the body; ``None`` if none was completed."""
        return self._crc if self.keeps_crc and self._crc_end == self._length else None

    def close(self) -> None:
        # aiohttp closes a payload's file when the request ends; a retry still needs it.
        pass

    def _fill(self, position: int, target: memoryview) -> int:
        """Copy the body's bytes from ``position`` into all of ``target``; return the count."""
        raise NotImplementedError

    def _take(self, position: int, size: int) -> bytes:
        """``size`` bytes of the body from ``position``, as one new ``bytes`` (one copy)."""
        raise NotImplementedError


class MemoryPartBody(PartBody):
    """A part held in a buffer (a memoryview of it)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(len(view))
        self._view = view

    def _fill(self, position: int, target: memoryview) -> int:
        target[:] = self._view[position : position + len(target)]
        return len(target)

    def _take(self, position: int, size: int) -> bytes:
        return bytes(self._view[position : position + size])


class SharedDescriptor:
    """A duplicate of a file's descriptor, closed when the last part body reading it is gone.

    The caller may close its file as soon as a save fails, while a client thread still reads a
    part that is being abandoned; a descriptor of our own keeps such a read on the same file
    (never on whatever file reuses the caller's descriptor number).
    """

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


class FilePartBody(PartBody):
    """A range of a regular file, read (``pread``) only as the body is sent."""

    keeps_crc = True

    def __init__(self, file: SharedDescriptor, offset: int, length: int, shown_as: str) -> None:
        super().__init__(length)
        self._file = file
        self._offset = offset
        self._shown_as = shown_as

    def _fill(self, position: int, target: memoryview) -> int:
        filled = 0
        while filled < len(target):
            count = os.preadv(self._file.fd, [target[filled:]], self._offset + position + filled)
            if not count:
                raise self._shorter()
            filled += count
        return filled

    def _take(self, position: int, size: int) -> bytes:
        chunk = os.pread(self._file.fd, size, self._offset + position)
        if len(chunk) < size:  # at the file's end (it shrank), or a filesystem that reads short
            whole = bytearray(size)
            self._fill(position, memoryview(whole))
            return bytes(whole)
        return chunk

    def _shorter(self) -> InputChangedError:
        return InputChangedError(
            f"{self._shown_as} got shorter while it was being uploaded, so the upload was "
            "discarded and the previous checkpoint kept; do not rewrite a file while it is being saved"
        )
