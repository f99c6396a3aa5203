"""Writing the data of extracted files: on a pool of threads when there are several.

The extracting thread parses the tar stream, checks every member and creates each file; the
bytes of a file then go to ``os.pwritev`` at their offset, on the pool, up to a MiB of pieces
per call, so a load is not bound by one thread copying into the page cache while the others
inflate. Where the reader routes a file's data (:mod:`.routing`), the pool thread that read a
member writes it (:meth:`FileWrites.route`), and the extracting thread only counts what it
wrote, or was promised will be written: a promised job is waited for like a write of the
file's own. A run of pieces, at least :data:`HOLE_FROM` bytes in all, that holds only zeros is not
written but left as a hole, as ``tar -S`` would. A file is
finished (its size set when it has holes, its mode and times applied, closed) on the extracting
thread, and only once every write to it has returned, so its mtime is the archive's.

Memory is bounded: at most :data:`AHEAD_PER_THREAD` writes per thread are in flight before the
extracting thread waits for the oldest; each keeps alive what its pieces are views of (an
inflated block, or a stored member as read: a MiB or two). Errors of a write (a full disk) are raised on the
extracting thread by the next call that finds that write done, at the latest by :meth:`finish_all`.
Abandoning (any exception, an interrupt too) drops the writes not started, waits for those
already running (routed ones too) and closes every file: no descriptor is left open, none is
closed under a running write, and a routed write that comes after is refused.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from flyte_checkpoint.archive.members import past
from flyte_checkpoint.archive.routing import Piece, Route, Written

HOLE_FROM = 64 * 1024
"""A chunk of at least this many zero bytes is left as a hole instead of written."""

_ZEROS = bytes(1 << 20)

POOLED_FROM = 64 * 1024
"""Chunks smaller than this are written by the extracting thread: handing them over costs more."""

AHEAD_PER_THREAD = 4

OPEN_FILES = 64
"""Files kept open while their writes finish, before the extracting thread waits for the oldest."""


@dataclass
class OpenFile:
    """A file being extracted: its descriptor, and what to apply once its writes are done."""

    fd: int
    size: int
    mode: int
    mtime: float
    pending: deque[Future[Any]] = field(default_factory=deque)
    """Writes to wait for before the file is finished: its pooled writes and promised jobs."""
    holes: bool = False
    routed: threading.Lock = field(default_factory=threading.Lock)
    """Held by a routed write (:meth:`FileWrites.route`) and to close the file."""
    closed: bool = False

    def writes_done(self) -> bool:
        while self.pending and self.pending[0].done():
            self.pending.popleft().result()
        return not self.pending


class FileWrites:
    """Writes files' data on ``pool``, a pool of ``threads`` that its caller shuts down, or on
    the calling thread when there is none."""

    def __init__(self, pool: Executor | None, threads: int) -> None:
        self._pool = pool
        self._ahead = AHEAD_PER_THREAD * threads
        self._in_flight: deque[Future[None]] = deque()
        self._closing: deque[OpenFile] = deque()
        self._open: dict[int, OpenFile] = {}

    def __enter__(self) -> FileWrites:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if kind is None:
            self.finish_all()
        else:
            self.abandon()

    def start(self, fd: int, size: int, mode: int, mtime: float) -> OpenFile:
        """Take over the new, empty file ``fd``: it is closed by :meth:`end` or :meth:`abandon`."""
        file = OpenFile(fd, size, mode, mtime)
        self._open[fd] = file
        return file

    def route(self, file: OpenFile) -> Route:
        """How pool threads write data of ``file`` they read (:mod:`.routing`): at once, on that
        thread; refused once the file is closed (:meth:`abandon`). The file is finished only
        once the jobs promised to it are done."""
        return _FileRoute(file)

    def write(self, file: OpenFile, parts: list[Piece], offset: int) -> None:
        """Write ``parts``, in order, at ``offset`` of ``file``, with one ``pwritev`` where it can
        (a hole when they are all zeros, see :data:`HOLE_FROM`); :class:`~.routing.Written`
        parts were written already and are skipped. They must not change until the write is
        done."""
        run: list[bytes | memoryview] = []
        for part in parts:
            if isinstance(part, Written):
                self._write_run(file, run, offset)
                offset += sum(len(piece) for piece in run) + len(part)
                run = []
            else:
                run.append(part)
        self._write_run(file, run, offset)

    def _write_run(self, file: OpenFile, parts: list[bytes | memoryview], offset: int) -> None:
        size = sum(len(part) for part in parts)
        if not size or _is_hole(file, parts):
            return
        if self._pool is None or size < POOLED_FROM:
            _write_all(file.fd, parts, offset)
            return
        while len(self._in_flight) >= self._ahead:
            # Forgotten only once done: abandon() must wait for a write an interrupt lands beside.
            self._in_flight[0].result()
            self._in_flight.popleft()
        future = self._pool.submit(_write_all, file.fd, parts, offset)
        self._in_flight.append(future)
        file.pending.append(future)

    def end(self, file: OpenFile) -> None:
        """No more writes to ``file``: it is finished now, or once its writes are done."""
        self._closing.append(file)
        self._finish_ready()
        while len(self._closing) > OPEN_FILES:
            self._finish(self._closing.popleft(), block=True)

    def finish_all(self) -> None:
        """Wait for every write and finish every file; raises the first write's error."""
        try:
            while self._closing:
                self._finish(self._closing.popleft(), block=True)
        except BaseException:
            self.abandon()
            raise
        self._in_flight.clear()

    def abandon(self) -> None:
        """Stop: writes not started are dropped, running ones waited for, every file closed."""
        for future in self._in_flight:
            future.cancel()
        wait(self._in_flight)  # no write may still be using a descriptor closed below
        self._in_flight.clear()
        self._closing.clear()
        for file in self._open.values():
            _close(file)
        self._open.clear()

    def _finish_ready(self) -> None:
        while self._in_flight and self._in_flight[0].done():
            self._in_flight.popleft().result()
        while self._closing and self._closing[0].writes_done():
            self._finish(self._closing.popleft(), block=False)

    def _finish(self, file: OpenFile, *, block: bool) -> None:
        while block and file.pending:
            file.pending.popleft().result()
        if file.holes:
            os.ftruncate(file.fd, file.size)  # zeros skipped at its end left the file short
        os.fchmod(file.fd, file.mode)
        os.utime(file.fd, (file.mtime, file.mtime))
        del self._open[file.fd]
        _close(file)


class _FileRoute:
    """A :class:`~.routing.Route` to ``file``."""

    def __init__(self, file: OpenFile) -> None:
        self._file = file

    def write(self, pieces: list[memoryview], offset: int) -> None:
        # One routed write at a time per file, the others waiting asleep: the kernel
        # serialises writes to one file anyway, and its waiters spin on a core that the
        # other pool threads and the extracting thread could use.
        file = self._file
        with file.routed:
            if file.closed:
                raise RuntimeError(f"routed write to closed file descriptor {file.fd}")
            if not _is_hole(file, pieces):
                _write_all(file.fd, pieces, offset)

    def promise(self, job: Future[Any]) -> None:
        self._file.pending.append(job)  # on the extracting thread, as FileWrites' own writes


def _close(file: OpenFile) -> None:
    """Close ``file`` once no routed write is running on it, and refuse any that comes later."""
    with file.routed:
        file.closed = True
        os.close(file.fd)


def _is_hole(file: OpenFile, parts: Sequence[bytes | memoryview]) -> bool:
    """Whether ``parts`` are zeros enough to be left as a hole in ``file`` (noting that it has one)."""
    # The zeros first: on most data the first part's ends already say no.
    if all(_all_zeros(part) for part in parts) and sum(len(part) for part in parts) >= HOLE_FROM:
        file.holes = True
        return True
    return False


def _all_zeros(part: bytes | memoryview) -> bool:
    # The ends first: most data is not zeros. startswith compares with memcmp, where == on a
    # memoryview compares byte by byte.
    return 0 < len(part) <= len(_ZEROS) and part[0] == part[-1] == 0 and _ZEROS.startswith(part)


def _write_all(fd: int, parts: Sequence[bytes | memoryview], offset: int) -> None:
    views = [memoryview(part) for part in parts]
    left = sum(len(view) for view in views)
    while left:
        written = _pwrite_from(fd, views, offset)
        offset += written
        left -= written
        if left:
            views = past(views, written)


if hasattr(os, "pwritev"):

    def _pwrite_from(fd: int, views: list[memoryview], offset: int) -> int:
        return os.pwritev(fd, views, offset)  # one call writes every part

else:  # pragma: no cover - platforms without pwritev

    def _pwrite_from(fd: int, views: list[memoryview], offset: int) -> int:
        return os.pwrite(fd, views[0], offset)
