"""Parallel transfers to object stores: N upload parts or N ranged reads in flight at once.

Store-agnostic. A store adapter (see ``s3_parallel.py``) supplies a few coroutines through
:class:`UploadTarget` and :class:`RangeSource`; this module runs them on the store client's own
event loop (fsspec's loop thread for s3fs, gcsfs and adlfs) with
``asyncio.run_coroutine_threadsafe``, so the caller's thread only copies bytes and blocks when
the pool is full.

Memory is a function of the settings, not of the object: an upload holds at most
``max_concurrency + 1`` buffers of ``part_size`` (up to ``max_concurrency`` in flight and one
being filled), a download ``max_concurrency`` (see :func:`transfer_memory`). Buffers are
allocated once per transfer and reused; parts go out as memoryviews of them. A regular file is
uploaded without part buffers: each part is read from the file as it is sent, so its
``file_concurrency`` parts in flight cost one read chunk each (:meth:`ParallelWriter.write_from`).

Atomicity: an upload becomes visible only when the store completes it (S3:
CompleteMultipartUpload, or the single PutObject of an object smaller than one part), which
happens in :meth:`ParallelWriter.commit` after every part succeeded. Any failure, abort or
``KeyboardInterrupt`` cancels the parts in flight and aborts the upload; the previous object
stays. An upload started by a request whose answer was lost is aborted too
(:meth:`ParallelWriter._discard_strays`). A download is pinned to the version its first
response described: a replacement that lands meanwhile fails the load
(:class:`ObjectReplacedError`) instead of mixing versions.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import io
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from flyte_checkpoint.errors import CheckpointStorageError, CheckpointUnavailableError, InputChangedError
from flyte_checkpoint.progress import ProgressReporter
from flyte_checkpoint.storage.base import (
    COPY_CHUNK,
    DIGEST_KEY,
    SIZE_KEY,
    ObjectInfo,
    ObjectWriter,
    ReadsInto,
    WriteGate,
)
from flyte_checkpoint.storage.deadline import TransferBound, outside_deadlines
from flyte_checkpoint.storage.digests import crc32
from flyte_checkpoint.storage.kernel_copy import regular_file_descriptor
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.remote_errors import classify, translated_backend_errors
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.uris import scheme_of

logger = logging.getLogger("flyte_checkpoint")

T = TypeVar("T")
_Future = concurrent.futures.Future

_MiB = 1 << 20
_GATE_POLL = 0.02
"""Seconds between looks at a background save's pause gate from the store's loop."""
_PART_GROWTH = 1024
"""An upload of unknown length makes each part at least 1/1024 of what was written before it, so
an object of any size the store accepts fits in its part limit (S3: 5 TiB in 10,000 parts)."""
_LISTING_BOUND = 10.0
"""Seconds the listing of an object's uploads before a multipart upload starts may take; past
it the upload starts without it (and cannot abort uploads whose start went unanswered)."""


def transfer_memory(settings: TransferSettings) -> int:
    """Bytes of buffers one save or load holds at most: ``(max_concurrency + 1) * part_size``.

    An upload fills one buffer while up to ``max_concurrency`` are in flight (so a finished part
    is replaced at once: with one buffer fewer, a connection idled while the next part was
    filled, a directory save measured 18% slower); a download fills ``max_concurrency``; the
    save of a regular file holds none (its parts are read from the file as they are sent). The
    process adds its own baseline (interpreter, client libraries) and the HTTP library's socket
    buffers, about 0.5 MiB per connection.
    """
    return (settings.max_concurrency + 1) * settings.part_size


def part_size_for(settings: TransferSettings, max_parts: int, expected: int | None, sent: int) -> int:
    """The part size for an upload of ``expected`` bytes (``None``: unknown, ``sent`` so far)."""
    wanted = -(-expected // max_parts) if expected is not None else sent // _PART_GROWTH
    return max(settings.part_size, -(-wanted // _MiB) * _MiB)


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


class ObjectReplacedError(CheckpointUnavailableError):
    """The object was replaced while it was being read; loading again reads the new one whole."""


# -- the store's side -------------------------------------------------------------------------


class UploadTarget(Protocol):
    """One destination object, as a store adapter uploads it (S3 multipart, Azure blocks...)."""

    @property
    def uri(self) -> str: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the store client runs on."""

    @property
    def max_parts(self) -> int: ...

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        """Store ``body`` as the whole object in one request."""

    async def create(self, metadata: Mapping[str, str]) -> str:
        """Start a multipart upload; return its id."""

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        """Send part ``number`` (1-based) from ``body``; return the receipt the completion needs (ETag)."""

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        """Publish the object from its parts, in order: the one atomic step."""

    async def abort(self, upload_id: str) -> None:
        """Discard the upload and its parts; absent is fine."""

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Abort other uploads to this object started more than ``older_than`` s ago; their count."""

    @property
    def lost_creates(self) -> int:
        """Requests to start an upload that the client retried after their answer was lost (each
        may have started an upload whose id never came back); 0 where starting sends none."""

    async def unfinished(self) -> list[str]:
        """The ids of the uploads to this object not yet completed or aborted, in the order they
        were started; empty where no upload can start without its id coming back."""

    async def holds_parts(self, upload_id: str) -> bool:
        """Whether the upload has stored a part (absent: ``False``)."""

    async def discard_unfinished(self) -> int:
        """Abort every unfinished upload to this object (only for one no writer is saving); their count."""


class RangeBody(Protocol):
    """A response body being received (aiobotocore's ``StreamingBody`` is one)."""

    async def readinto(self, b: memoryview, /) -> int: ...

    async def aclose(self) -> None: ...


class RangeSource(Protocol):
    """One stored object, as a store adapter reads it by ranges."""

    @property
    def uri(self) -> str: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        """GET the first ``length`` bytes; ``info`` describes the whole object (its size, version
        and metadata); ``None`` when there is no object."""

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        """GET ``length`` bytes from ``start`` of the object as it was at ``version``; raise
        :class:`ObjectReplacedError` when it has been replaced since."""


# -- running coroutines on the store's loop ---------------------------------------------------
# Every coroutine goes to the store's loop through :meth:`TransferBound.submit`, and every wait for
# one through :meth:`TransferBound.result` / :meth:`TransferBound.wait_any`: nothing waits unbounded.


_RETRIED_BY_CLIENT = "_flyte_checkpoint_retried_by_client"


def mark_retried_by_client(exc: BaseException) -> None:
    """Say that the store's client already spent its own retries on the request that raised ``exc``.

    Store adapters call this for errors of requests their client retries (botocore's
    ``max_attempts``, Azure's ``retry_total``): the part layer then does not repeat them, so the
    retries of one request do not multiply (see :mod:`.retry`).
    """
    setattr(exc, _RETRIED_BY_CLIENT, True)


async def _with_retries(policy: RetryPolicy, describe: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, retried on transient failures within ``policy``'s budget.

    Failures the client already retried (:func:`mark_retried_by_client`) are raised at once.
    """
    for tries in range(1, policy.attempts + 1):
        try:
            return await attempt()
        except (ObjectReplacedError, InputChangedError):
            raise  # another try meets the same replacement or changed file: nothing to retry
        except Exception as exc:
            retried = getattr(exc, _RETRIED_BY_CLIENT, False)
            if retried or classify(exc) != "transient" or tries == policy.attempts:
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(f"{describe}: gave up after {tries} attempt(s)")
                raise
            wait = policy.delay(tries)
            logger.debug("%s failed (%s); retry %d in %.2f s", describe, exc, tries, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


# -- uploads ----------------------------------------------------------------------------------


class ParallelWriter(ObjectWriter):
    """An upload with up to ``max_concurrency`` parts in flight, published only by :meth:`commit`.

    ``write()`` copies the caller's bytes once, into the buffer being filled; a full buffer
    becomes the next part and goes out at once while the caller fills another. With every
    buffer in flight, ``write()`` blocks until a part finishes (in any order). A failed part is
    retried on its own (``part_attempts``); one that still fails aborts the whole upload, and
    the next ``write()`` or the commit raises its error. Fewer bytes than one part are sent as
    one PUT at commit, with the final metadata (digest and size included). A regular file
    given to :meth:`write_from` is sent straight from the file, without buffers.
    """

    @classmethod
    def opened(
        cls,
        target: UploadTarget,
        metadata: Mapping[str, str],
        settings: TransferSettings,
        *,
        metadata_at_start: bool,
        declared_digest: str | None = None,
        declared_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
        deadline: TransferBound | None = None,
    ) -> ParallelWriter:
        """A writer with :meth:`Backend.open_write`'s contract: the commit refuses content that
        differs from a declared digest and size. Where the store takes metadata only when an
        upload starts (``metadata_at_start``: S3), the declared digest and size go with it."""
        at_start = dict(metadata)
        if metadata_at_start and declared_digest is not None and declared_size is not None:
            at_start.update({DIGEST_KEY: declared_digest, SIZE_KEY: str(declared_size)})
        writer = cls(
            target,
            at_start,
            settings,
            expected_size=declared_size,
            progress=progress,
            gate=gate,
            deadline=deadline,
        )
        writer.declare(declared_digest, declared_size)
        return writer

    def __init__(
        self,
        target: UploadTarget,
        metadata: Mapping[str, str],
        settings: TransferSettings,
        *,
        expected_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
        deadline: TransferBound | None = None,
    ) -> None:
        super().__init__(target.uri, progress=progress, gate=gate)
        self.metadata.update(metadata)
        # What a multipart upload starts with: fixed now, as the commit adds to self.metadata
        # while the first part may still be starting the upload on the loop.
        self._metadata_at_start = dict(metadata)
        self._target = target
        self._settings = settings
        self._policy = settings.policy()
        self._expected = expected_size
        self._deadline = deadline or settings.deadline(target.uri, "saving", target.loop, expected_size)
        self._part_size = part_size_for(settings, target.max_parts, expected_size, 0)
        # Larger parts (huge uploads) keep the memory of the configured ones: fewer in flight.
        self._budget = transfer_memory(settings)
        self._free: list[bytearray] = []
        self._live = 0
        self._current: bytearray | None = None
        self._filled = 0
        self._next_part = 1
        self._in_flight: dict[concurrent.futures.Future[str], tuple[int, bytearray | None, int]] = {}
        """Each part in flight: its number, its buffer (``None``: sent from a file), its length."""
        self._receipts: dict[int, str] = {}
        self._acknowledged = 0
        """Bytes of parts sent from a file that the store has taken: their progress."""
        self._from_file = False
        # Touched only on the store's loop:
        self._created: asyncio.Task[str] | None = None
        self._sweep: asyncio.Task[int] | None = None
        self._strays: asyncio.Task[None] | None = None
        self._before: frozenset[str] | None = None
        """The object's unfinished uploads before this writer started its own (``None``: unknown)."""
        self._create_tries = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    # caller's thread

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self._from_file and len(data):
            raise RuntimeError(f"the save to {self.uri} was sent from a file; nothing can be added after it")
        with memoryview(data) as given, given.cast("B") as view:
            offset = 0
            while offset < len(view):
                if self._current is None:
                    self._current = self._take_buffer()
                elif self._filled == len(self._current):
                    # Sent only once more data proves it is not the last: then a whole
                    # object smaller than a part is one PUT at commit.
                    self._send_current()
                    continue
                count = min(len(view) - offset, len(self._current) - self._filled)
                self._current[self._filled : self._filled + count] = view[offset : offset + count]
                self._filled += count
                offset += count

    def write_from(self, source: ReadsInto, chunk_size: int = COPY_CHUNK) -> int:
        """Append everything ``source`` holds from its position to its end; return the count.

        A regular file (a file opened for reading) that holds more than one part, given before
        anything else was written, is sent straight from the file: each part is read from it
        while it goes out (``pread``, no buffer per part), up to ``file_concurrency`` parts in
        flight, and nothing may be written after it. The object's digest is joined from the
        CRC32s of the bytes each part actually sent, so a save of a file that changed meanwhile
        records what was stored (and a declared digest taken earlier no longer matches:
        :class:`~flyte_checkpoint.errors.InputChangedError`). Progress counts the bytes of the
        parts the store has taken. Anything else is copied through the part buffers like
        :meth:`write`.
        """
        fd = regular_file_descriptor(source)
        if fd is None or self._size or self._current is not None or not self._digest.joinable:
            return super().write_from(source, chunk_size)
        assert isinstance(source, io.BufferedReader | io.FileIO)
        start, end = source.tell(), os.fstat(fd).st_size
        part_size = part_size_for(self._settings, self._target.max_parts, end - start, 0)
        if end - start <= part_size:
            return super().write_from(source, chunk_size)
        self._from_file = True
        shown_as = str(getattr(source, "name", self.uri))
        file = SharedDescriptor(fd)
        bodies: list[PartBody] = []
        with translated_backend_errors(self.uri, "saving", scheme_of(self.uri)):
            for offset in range(start, end, part_size):
                if self._gate is not None:
                    self._gate.wait()
                self._wait_for_room(self._settings.file_concurrency)
                self._raise_failed()
                bodies.append(FilePartBody(file, offset, min(part_size, end - offset), shown_as))
                self._send(self._next_part, bodies[-1], None, offset - start + len(bodies[-1]))
            self._wait_for_room(1)
        for number, body in enumerate(bodies, start=1):  # in order: the digest of the object as stored
            crc = body.sent_crc()
            if crc is None:
                raise CheckpointStorageError(
                    f"part {number} of the save to {self.uri} was stored, but the store's client "
                    "did not read it from its start to its end, so what it sent is not known; the "
                    "upload was discarded and the previous checkpoint kept. Save the file's bytes "
                    "instead, and please report this with the client library's version"
                )
            self._count_crc32(crc, len(body))
        source.seek(end)
        return end - start

    def _buffers_allowed(self) -> int:
        return max(2, min(self._settings.max_concurrency + 1, self._budget // self._part_size))

    def _take_buffer(self) -> bytearray:
        with translated_backend_errors(self.uri, "saving", scheme_of(self.uri)):
            return self._free_buffer()

    def _free_buffer(self) -> bytearray:
        self._raise_failed()
        while True:
            if self._free:
                return self._free.pop()
            if self._live < self._buffers_allowed():
                self._live += 1
                size = self._part_size
                if self._expected is not None and self._next_part == 1:
                    size = min(size, max(self._expected, 1))  # a small object needs no whole part
                return bytearray(size)
            self._harvest(self._deadline.wait_any(list(self._in_flight)))

    def _harvest(self, done: set[concurrent.futures.Future[str]]) -> None:
        """Collect finished parts: keep their receipts, take back their buffers, raise a failure."""
        for future in done:
            number, buffer, length = self._in_flight.pop(future)
            if buffer is None:
                pass  # sent from a file: no buffer to take back
            elif len(buffer) == self._part_size:
                self._free.append(buffer)
            else:
                self._live -= 1  # outgrown (or the small first buffer): let it go
            self._receipts[number] = future.result()  # raises the part's failure
            if buffer is None and self._progress is not None:
                self._acknowledged += length
                self._progress.advance(self._acknowledged)

    def _wait_for_room(self, limit: int) -> None:
        """Block until fewer than ``limit`` parts are in flight; raise a failed part's error.

        A background save's gate is looked at between parts (without waiting on its pause):
        one that may no longer commit (a newer save committed first) ends here, instead of
        waiting for parts whose upload is thrown away. The process waited a second for them
        at the end of a preemption, on S3, before it could exit.
        """
        look_every = None if self._gate is None else _GATE_POLL * 5
        with translated_backend_errors(self.uri, "saving", scheme_of(self.uri)):
            while len(self._in_flight) >= limit:
                self._harvest(self._deadline.wait_any(list(self._in_flight), within=look_every))
                if self._gate is not None:
                    self._gate.wait(0)  # raises if this upload may no longer commit

    def _raise_failed(self) -> None:
        failed = {future for future in self._in_flight if future.done() and future.exception() is not None}
        if failed:
            self._harvest(failed)

    def _send_current(self) -> None:
        assert self._current is not None
        number, buffer, length = self._next_part, self._current, self._filled
        if number > self._target.max_parts:
            raise CheckpointStorageError(
                f"saving {self.uri} needs more than the store's {self._target.max_parts} parts; "
                "declare the size up front or raise the storage option part_size"
            )
        self._wait_for_room(self._settings.max_concurrency)
        self._current, self._filled = None, 0
        self._send(number, MemoryPartBody(memoryview(buffer)[:length]), buffer, self._size + length)
        if self._expected is None:
            self._part_size = part_size_for(self._settings, self._target.max_parts, None, self._size)

    def _send(self, number: int, body: PartBody, buffer: bytearray | None, end: int) -> None:
        """Start uploading part ``number`` from ``body``, which ends ``end`` bytes into the object."""
        self._next_part = number + 1
        self._deadline.allow_for(end)
        future = self._deadline.submit(self._send_part(number, body))
        self._in_flight[future] = (number, buffer, len(body))

    def _prepare(self) -> None:
        """Send the last part and wait for every part: the waits on the pause gate are here."""
        if self._next_part == 1:
            return  # smaller than a part: the one PUT of the commit
        with translated_backend_errors(self.uri, "saving", scheme_of(self.uri)):
            if self._filled:
                self._send_current()
            self._wait_for_room(1)

    def _commit(self) -> None:
        # The atomic step: one PUT, or the request that completes the multipart upload (the
        # store shows the object only once it is complete); neither waits on the pause gate.
        with translated_backend_errors(self.uri, "saving", scheme_of(self.uri)):
            if self._next_part == 1:
                body = memoryview(self._current or b"")[: self._filled]
                self._deadline.result(self._deadline.submit(self._put(body)))
                self._release()
                return
            receipts = sorted(self._receipts.items())
            self._deadline.result(self._deadline.submit(self._complete(receipts)))
        self._release()

    def _abort(self) -> None:
        for future in self._in_flight:
            future.cancel()
        # Under a bound of its own, never the operation's (which may have passed, and would
        # cancel the abort at once): an upload left behind is swept by a later save
        # (stale_upload_age) or the bucket's lifecycle rule.
        cleanup = self._deadline.for_cleanup()
        try:
            cleanup.result(cleanup.submit(self._abort_upload()))
        except Exception as exc:
            logger.warning("could not abort the unfinished upload to %s: %r", self.uri, exc)
        finally:
            cleanup.finish()
        self._release()
        self._deadline.finish()

    def _release(self) -> None:
        self._in_flight.clear()
        self._free.clear()
        self._current = None
        self._deadline.finish()

    # store's loop

    def _track(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upload_id(self) -> str:
        if self._created is None:
            describe = f"starting the upload of {self.uri}"
            # Outside every deadline (the client's request timeouts bound it): when a deadline
            # cancelled the create in flight, the upload could exist on the store with no id
            # to abort it by, and the abort found nothing ("CancelledError") and left it behind.
            self._created = outside_deadlines(self._start_upload(describe))
        upload_id = await asyncio.shield(self._created)
        if self._sweep is None:
            self._sweep = asyncio.ensure_future(self._sweep_stale(upload_id))
            if self._create_tries > 1 or self._target.lost_creates:
                self._strays = asyncio.ensure_future(self._discard_strays(upload_id))
        return upload_id

    async def _start_upload(self, describe: str) -> str:
        # The uploads already there are not this writer's: only those that appear after this
        # listing can be the ones a create whose answer was lost started (_discard_strays).
        try:
            self._before = frozenset(await asyncio.wait_for(self._target.unfinished(), _LISTING_BOUND))
        except Exception as exc:  # no permission to list uploads, say: the save goes on without
            logger.debug("could not list the unfinished uploads to %s: %r", self.uri, exc)

        def create() -> Awaitable[str]:
            self._create_tries += 1
            return self._target.create(self._metadata_at_start)

        return await _with_retries(self._policy, describe, create)

    async def _settle_strays(self) -> None:
        """Let :meth:`_discard_strays` of this writer's own upload end, within a bound: it must
        run while that upload is listed, and may not hold up the commit or the abort for long."""
        if self._strays is not None:
            await asyncio.wait({self._strays}, timeout=_LISTING_BOUND)
            self._strays.cancel()

    async def _discard_strays(self, keep: str | None) -> None:
        """Abort the uploads this writer started whose ids never came back to it.

        A request to start an upload whose answer is lost (a reset, a timeout) may have started
        one all the same, and a retry starts another: what it started has an id only the
        store knows. Such an upload is one the listing before the first request did not show,
        that has no part (nothing can send a part without its id) and, when this writer's own
        upload ``keep`` did start, that began before it (S3 lists one key's uploads oldest
        first). Another writer's upload to the same object is left alone unless it began within
        this writer's unanswered requests and has not stored a part yet. Best effort: a failure
        is logged, never raised over the save's own outcome.
        """
        if self._before is None:
            return
        try:
            listed = await self._target.unfinished()
            if keep is not None:
                if keep not in listed:
                    return  # nothing to tell which ones began before this writer's own
                listed = listed[: listed.index(keep)]
            for upload_id in listed:
                if upload_id in self._before or await self._target.holds_parts(upload_id):
                    continue
                await self._target.abort(upload_id)
                logger.info(
                    "aborted upload %s to %s, started by a request whose answer was lost", upload_id, self.uri
                )
        except Exception as exc:
            logger.warning("could not abort the uploads to %s whose start went unanswered: %r", self.uri, exc)

    async def _sweep_stale(self, keep: str) -> int:
        # A failure here (e.g. no permission to list uploads) must not fail the save.
        try:
            return await self._target.sweep_stale(keep, self._settings.stale_upload_age)
        except Exception as exc:
            logger.warning("could not look for stale uploads to %s: %s", self.uri, exc)
            return 0

    async def _send_part(self, number: int, body: PartBody) -> str:
        self._track()
        upload_id = await self._upload_id()

        async def attempt() -> str:
            await self._gate_open()
            body.rewind()  # the client sends from the body's position; a retry starts over
            try:
                return await self._target.upload_part(upload_id, number, body)
            except Exception as exc:
                if body.failure is not None:
                    # Reading the source failed (a file cut short): not the connection error
                    # the HTTP client made of it, and not worth another try.
                    raise body.failure from exc
                raise

        return await _with_retries(self._policy, f"uploading part {number} of {self.uri}", attempt)

    async def _gate_open(self) -> None:
        """Hold a part that has not started while a background save is paused (the gate clear).

        ``write()`` waits for the gate in the caller's thread; parts queued before the pause
        wait here, so no request starts while the caller takes its snapshot. A request already
        sending finishes. Bounded by the deadline, which cancels this wait with the rest.
        """
        # A threading.Event set by another thread: polled, as no asyncio.Event can mirror it.
        # ``wait(0)`` never blocks, and raises for an upload that may no longer commit, so a
        # superseded upload sends none of its parts that had not started.
        while self._gate is not None and not self._gate.wait(0):  # noqa: ASYNC110
            await asyncio.sleep(_GATE_POLL)

    async def _put(self, body: memoryview) -> None:
        await _with_retries(
            self._policy, f"uploading {self.uri}", lambda: self._target.put(body, dict(self.metadata))
        )

    async def _complete(self, receipts: Sequence[tuple[int, str]]) -> None:
        upload_id = await self._upload_id()
        await self._settle_strays()  # while this writer's own upload is listed to tell them by
        await _with_retries(
            self._policy,
            f"completing the upload of {self.uri}",
            lambda: self._target.complete(upload_id, receipts, dict(self.metadata)),
        )
        if self._sweep is not None:
            await self._sweep

    async def _abort_upload(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._created is None:
            return  # no upload was started: nothing exists to clean up
        try:
            upload_id = await self._created
        except (Exception, asyncio.CancelledError):
            # No id came back, yet a request may have started an upload all the same.
            await self._discard_strays(None)
            return
        await self._settle_strays()
        await _with_retries(
            self._policy, f"aborting the upload of {self.uri}", lambda: self._target.abort(upload_id)
        )
        if self._sweep is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._sweep


# -- downloads --------------------------------------------------------------------------------


@dataclass
class _Range:
    storage: bytearray
    """The reusable buffer; :attr:`buffer` is the part of it this range fills."""
    buffer: memoryview
    future: concurrent.futures.Future[None]
    consumed: int = 0


class ParallelReader(io.RawIOBase):
    """An object read by up to ``max_concurrency`` ranged GETs in flight, handed out in order.

    Wrap it in :class:`~flyte_checkpoint.storage.base.VerifyingReader`: it reads like a plain
    stream from the start to the end. Every range after the first is pinned to the version the
    first response reported; a range that fails is retried on its own; memory stays at
    ``max_concurrency`` buffers of ``part_size``, each reused for the range after the next ones.
    """

    def __init__(
        self,
        source: RangeSource,
        info: ObjectInfo,
        first: RangeBody,
        settings: TransferSettings,
        *,
        deadline: TransferBound | None = None,
    ) -> None:
        super().__init__()
        self.info = info
        self._source = source
        self._policy = settings.policy()
        self._range_size = settings.part_size
        self._deadline = deadline or settings.deadline(source.uri, "loading", source.loop, info.size)
        self._deadline.allow_for(info.size)
        self._ranges: collections.deque[_Range] = collections.deque()
        self._next_start = 0
        slots = min(settings.max_concurrency, max(1, -(-info.size // self._range_size)))
        for index in range(slots):
            length = min(self._range_size, info.size - self._next_start)
            if index and length <= 0:
                break
            self._schedule(bytearray(max(length, 0)), first if index == 0 else None)

    @classmethod
    def open(
        cls, source: RangeSource, settings: TransferSettings, *, deadline: TransferBound | None = None
    ) -> ParallelReader | None:
        """Send the first GET and start the others; ``None`` when there is no object."""
        deadline = deadline or settings.deadline(source.uri, "loading", source.loop)
        opened = deadline.result(deadline.submit(source.open(settings.part_size)))
        if opened is None:
            deadline.finish()
            return None
        info, first = opened
        return cls(source, info, first, settings, deadline=deadline)

    def _schedule(self, storage: bytearray, first: RangeBody | None = None) -> None:
        start = self._next_start
        view = memoryview(storage)[: min(len(storage), self.info.size - start)]
        self._next_start += len(view)
        future = self._deadline.submit(self._fill(start, view, first))
        self._ranges.append(_Range(storage, view, future))

    async def _fill(self, start: int, into: memoryview, body: RangeBody | None) -> None:
        """Fill ``into`` with the bytes from ``start``; a body cut off resumes where it stopped."""
        filled = 0
        version = self.info.version
        describe = f"reading bytes {start}-{start + len(into) - 1} of {self.info.uri}"

        async def attempt() -> None:
            nonlocal body, filled
            try:
                while filled < len(into):
                    if body is None:
                        body = await self._source.get_range(start + filled, len(into) - filled, version)
                    count = await body.readinto(into[filled:])
                    if not count:
                        raise ConnectionResetError(f"the response ended {len(into) - filled} bytes early")
                    filled += count
            finally:
                # A retry resumes with a new GET from where this one stopped.
                done, body = body, None
                if done is not None:
                    with contextlib.suppress(Exception):
                        await done.aclose()

        await _with_retries(self._policy, describe, attempt)

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as given, given.cast("B") as target:
            while self._ranges:
                head = self._ranges[0]
                self._deadline.result(head.future)
                available = len(head.buffer) - head.consumed
                if available and len(target):
                    count = min(len(target), available)
                    target[:count] = head.buffer[head.consumed : head.consumed + count]
                    head.consumed += count
                    if head.consumed == len(head.buffer):
                        self._recycle()
                    return count
                if not len(target):
                    return 0
                self._recycle()
            return 0

    def _recycle(self) -> None:
        """The head range was handed out: its buffer fetches the next range not yet asked for."""
        head = self._ranges.popleft()
        if self._next_start < self.info.size:
            self._schedule(head.storage)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """Cancel the ranges still in flight (their connections are closed, not reused)."""
        while self._ranges:
            self._ranges.popleft().future.cancel()
        self._deadline.finish()
        super().close()
