"""The parallel upload: up to ``max_concurrency`` parts in flight, published only by the commit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from flyte_checkpoint.errors import CheckpointStorageError
from flyte_checkpoint.progress import ProgressReporter
from flyte_checkpoint.storage.base import (
    COPY_CHUNK,
    DIGEST_KEY,
    SIZE_KEY,
    ObjectWriter,
    ReadsInto,
    WriteGate,
)
from flyte_checkpoint.storage.deadline import TransferBound, outside_deadlines
from flyte_checkpoint.storage.errors import translated_backend_errors
from flyte_checkpoint.storage.kernel_copy import regular_file_descriptor
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.bodies import FilePartBody, MemoryPartBody, PartBody, SharedDescriptor
from flyte_checkpoint.storage.parallel.contract import UploadTarget
from flyte_checkpoint.storage.parallel.retries import with_retries
from flyte_checkpoint.storage.parallel.sizing import part_size_for, transfer_memory
from flyte_checkpoint.uris import scheme_of

logger = logging.getLogger("flyte_checkpoint")
T = TypeVar("T")

_GATE_POLL = 0.02
"""Seconds between looks at a background save's pause gate from the store's loop."""
_LISTING_BOUND = 10.0
"""Seconds the listing of an object's uploads before a multipart upload starts may take; past
it the upload starts without it (and cannot abort uploads whose start went unanswered)."""


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

        return await with_retries(self._policy, describe, create)

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

        return await with_retries(self._policy, f"uploading part {number} of {self.uri}", attempt)

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
        await with_retries(
            self._policy, f"uploading {self.uri}", lambda: self._target.put(body, dict(self.metadata))
        )

    async def _complete(self, receipts: Sequence[tuple[int, str]]) -> None:
        upload_id = await self._upload_id()
        await self._settle_strays()  # while this writer's own upload is listed to tell them by
        await with_retries(
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
        await with_retries(
            self._policy, f"aborting the upload of {self.uri}", lambda: self._target.abort(upload_id)
        )
        if self._sweep is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._sweep
