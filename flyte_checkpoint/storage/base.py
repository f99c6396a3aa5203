"""What every storage backend provides: atomic single-object writes and streaming reads."""

from __future__ import annotations

import abc
import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from types import TracebackType
from typing import IO, Any, Protocol

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import CheckpointCorruptError, CheckpointUnavailableError, InputChangedError
from flyte_checkpoint.progress import ProgressCallback, ProgressReporter, reporter
from flyte_checkpoint.storage.deadline import deadline_in_force, stopped_by
from flyte_checkpoint.storage.digests import ContentDigest, digest_of

# Metadata keys stored with every object this package writes. They let a reader verify the
# bytes (digest, size) and know the format without guessing from the content.
FORMAT_KEY = "flyte_checkpoint_format"
DIGEST_KEY = "flyte_checkpoint_digest"
SIZE_KEY = "flyte_checkpoint_size"
CONTENT_SIZE_KEY = "flyte_checkpoint_content_size"
"""Bytes of file content a directory archive unpacks to, as counted when it was saved."""
COPY_CHUNK = 1 << 20
"""Bytes per read when streaming one object or file into another: large enough that per-call
overhead does not matter, small enough to be one cheap reused buffer. Larger writes gained
nothing and made the kernel's page-cache allocation for them slower, not faster."""

FSYNC_OPTION = "fsync"
"""Storage option (and, as ``FLYTE_CHECKPOINT_FSYNC``, environment variable) that makes local
writes durable against power loss, not only atomic. Object stores ignore it: they are durable
once an upload completes."""


class WriteGate(Protocol):
    """What a pending object's writes wait on: a background save's pause (a ``threading.Event``
    will do). ``wait`` may raise to end the save, which then aborts like any failed write."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def is_set(self) -> bool: ...


CommitTurn = Callable[[], AbstractContextManager[None]]
"""Entered just before a writer's atomic commit step and held across it (see
:meth:`ObjectWriter.commit`); raising on entry refuses the commit."""


class ReadsInto(Protocol):
    """A binary stream that can fill a caller's buffer (files, :class:`VerifyingReader`)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


def read_chunks(source: ReadsInto, chunk_size: int = COPY_CHUNK) -> Iterator[memoryview]:
    """The rest of ``source``, chunk by chunk, read into one reused buffer instead of a new
    ``bytes`` per read: each chunk is valid only until the next one is read."""
    view = memoryview(bytearray(chunk_size))
    while count := source.readinto(view):
        yield view[:count]


_FRACTION = re.compile(r"\.(\d+)")


def modified_time(value: object) -> datetime | None:
    """A store's modification time as an aware datetime, or ``None`` when it gave none.

    Clients report it as a datetime (naive ones are UTC) or as RFC 3339 text: GCS's JSON API
    (and so gcsfs) sends ``"2026-12-04T15:27:12.66271Z"``, with a ``Z`` and as many fraction
    digits as it likes, which ``datetime.fromisoformat`` refuses before Python 3.11. Without a
    time, garbage collection can never tell an old chunk from a young one and keeps them all.
    """
    if isinstance(value, str):
        text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
        text = _FRACTION.sub(lambda match: "." + match.group(1)[:6].ljust(6, "0"), text, count=1)
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)


class ObjectInfo(BaseModel):
    """What a backend knows about a stored object."""

    model_config = ConfigDict(frozen=True)

    uri: str
    size: int
    metadata: Mapping[str, str] = {}
    modified: datetime | None = None
    version: str | None = None
    """The store's version tag (ETag, generation), to notice a replace while reading."""

    @property
    def recorded_digest(self) -> str | None:
        """The labelled digest (``"crc32:..."``) recorded when this package wrote the object, if kept."""
        return self.metadata.get(DIGEST_KEY)

    @property
    def recorded_size(self) -> int | None:
        """The byte count recorded when this package wrote the object, if kept.

        Raises :class:`CheckpointCorruptError` naming the object when the record is not a count.
        """
        recorded = self.metadata.get(SIZE_KEY)
        if recorded is None:
            return None
        if not recorded.isascii() or not recorded.isdigit():
            raise CheckpointCorruptError(
                f"checkpoint {self.uri} is damaged: its recorded size {recorded!r} is not a byte "
                "count; delete it to start fresh or point the source at a sound copy"
            )
        return int(recorded)

    @property
    def recorded_format(self) -> str | None:
        """``"archive"`` or ``"payload"`` when recorded with the object."""
        return self.metadata.get(FORMAT_KEY)

    @property
    def recorded_content_size(self) -> int | None:
        """The content bytes of a directory archive of ours, recorded when saved (``None``: none,
        or not a count)."""
        recorded = self.metadata.get(CONTENT_SIZE_KEY)
        if (
            self.recorded_format != "archive"
            or recorded is None
            or not (recorded.isascii() and recorded.isdigit())
        ):
            return None
        return int(recorded)


class ObjectWriter(abc.ABC):
    """A pending object. Nothing is visible at the destination until :meth:`commit` returns.

    Use it as a context manager: leaving the block normally commits, leaving it by an exception
    (including ``KeyboardInterrupt``) aborts, and the previous object stays as it was.
    """

    def __init__(
        self, uri: str, *, progress: ProgressReporter | None = None, gate: WriteGate | None = None
    ) -> None:
        self.uri = uri
        self._digest = ContentDigest()
        self._size = 0
        self._finished = False
        self.metadata: dict[str, str] = {}
        self._progress = progress
        self._gate = gate
        """When given, every write first waits until it is set (a background save's pause)."""
        self._declared: tuple[str, int] | None = None
        self._ceiling = deadline_in_force()
        """Checked as bytes are counted and before the commit: a local save has no store loop."""

    def declare(self, digest: str | None, size: int | None) -> None:
        """Promise the content's labelled digest and size; :meth:`commit` refuses anything else."""
        if digest is not None and size is not None:
            self._declared = (digest, size)
            self._digest = ContentDigest.like(digest, where=f"the save to {self.uri}")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append ``data`` to the pending object."""
        if self._gate is not None:
            self._gate.wait()
        self._write(data)
        self._account(data)
        return len(data)

    def _account(self, data: bytes | bytearray | memoryview) -> None:
        """Count ``data`` as written: digest, size, progress."""
        self._digest.update(data)
        self._size += len(data)
        if self._progress is not None:
            self._progress.advance(self._size)
        self._check_ceiling()

    def _check_ceiling(self) -> None:
        if self._ceiling is not None and self._ceiling.expired:
            raise stopped_by(self._ceiling, "saving", self.uri)

    def _count_crc32(self, crc: int, length: int) -> None:
        """Count ``length`` bytes digested elsewhere as ``crc`` (see :attr:`ContentDigest.joinable`)."""
        self._digest.join_crc32(crc, length)
        self._size += length

    def write_from(self, source: ReadsInto, chunk_size: int = COPY_CHUNK) -> int:
        """Append everything ``source`` holds from its position to its end; return the count.

        See :func:`read_chunks`.
        """
        total = 0
        for chunk in read_chunks(source, chunk_size):
            self.write(chunk)
            total += len(chunk)
        return total

    def writable(self) -> bool:
        return True

    def flush(self) -> None:  # noqa: B027 - deliberately a no-op for every backend
        """Nothing to do: data is durable only at :meth:`commit`."""

    def tell(self) -> int:
        return self._size

    def commit(self, *, turn: CommitTurn | None = None) -> ObjectInfo:
        """Make the object visible at its destination, atomically, with its digest recorded.

        The commit runs in two steps. :meth:`_prepare` finishes everything that can wait on a
        background save's pause gate (the last parts of an upload, a local file's flush and
        fsync); only then is ``turn()`` entered (a helper's commit order: it may raise to
        refuse the commit, which then aborts) and held across :meth:`_commit`, the one atomic
        step (completing the upload, the rename), which never waits on the gate. A turn held
        while parts waited on a gate that its holder's rival had closed was the preemption
        deadlock: each waited for the other.
        """
        if self._finished:
            raise RuntimeError(f"write to {self.uri} already finished")
        try:
            self._check_ceiling()
        except BaseException:
            self.abort()
            raise
        self._finished = True
        self.metadata[DIGEST_KEY] = self._digest.value
        self.metadata[SIZE_KEY] = str(self._size)
        if self._declared is not None and self._declared != (self.metadata[DIGEST_KEY], self._size):
            self._abort()
            raise InputChangedError(
                f"the data saved to {self.uri} changed while it was being uploaded (its digest or "
                "size differs from the one measured before), so the upload was discarded and the "
                "previous checkpoint kept; do not rewrite a file while it is being saved"
            )
        try:
            self._prepare()
            with turn() if turn is not None else contextlib.nullcontext():
                self._commit()
        except BaseException:
            self._abort()
            raise
        if self._progress is not None:
            self._progress.finish(self._size)
        # Fields this class built itself: no validation needed (it is a tenth of a 1 KiB save).
        return ObjectInfo.model_construct(uri=self.uri, size=self._size, metadata=dict(self.metadata))

    def abort(self) -> None:
        """Discard everything written; the destination keeps its previous object, if any."""
        if not self._finished:
            self._finished = True
            self._abort()

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    @abc.abstractmethod
    def _write(self, data: bytes | bytearray | memoryview) -> None: ...

    def _prepare(self) -> None:  # noqa: B027 - most of a commit is the atomic step for some stores
        """Finish what the commit needs before its atomic step; may wait on the write gate."""

    @abc.abstractmethod
    def _commit(self) -> None:
        """The atomic step that makes the object visible; never waits on the write gate."""

    @abc.abstractmethod
    def _abort(self) -> None: ...


class VerifyingReader(io.RawIOBase):
    """Reads an object and, on reaching its end, checks the recorded size and digest.

    The check runs when a read returns end-of-file, so a consumer that reads to the end (as
    every load does) cannot take a damaged object for a sound one.
    """

    def __init__(
        self,
        stream: IO[bytes],
        info: ObjectInfo,
        *,
        changed_since: Callable[[], bool] | None = None,
        translate_errors: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        progress: ProgressCallback | None = None,
    ) -> None:
        super().__init__()
        self._changed_since = changed_since
        self._translate_errors = translate_errors
        self._stream = stream
        self.info = info
        recorded = info.recorded_digest
        self._digest = ContentDigest.like(recorded, where=f"checkpoint {info.uri}") if recorded else None
        self._size = 0
        self._skipped = 0  # bytes skipped (read at offsets) that the stream has not yet moved past
        self._verified = False
        self._progress = reporter(progress, info.size)

    def read(self, size: int = -1) -> bytes:
        with self._translate_errors():
            self._move_past_skipped()
            data = self._stream.read(size)
        self._account(data, wanted=size != 0)
        return data

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        into = getattr(self._stream, "readinto", None)
        if into is None:
            data = self.read(len(view))
            view[: len(data)] = data
            return len(data)
        # Straight into the caller's buffer: no per-read allocation and copy of large chunks.
        with self._translate_errors():
            self._move_past_skipped()
            count = into(view) or 0
        self._account(view[:count], wanted=len(view) != 0)
        return count

    def _account(self, data: bytes | memoryview, *, wanted: bool) -> None:
        """Count and hash ``data``; an empty answer to a real request is end-of-file: verify."""
        if len(data):
            if self._digest is not None:
                self._digest.update(data)
            self._advance(len(data))
        elif wanted:
            self._verify()
            if self._progress is not None:
                self._progress.finish(self._size)

    def positional_reads(self) -> _VerifiedPositionalReads | None:
        """Reads at offsets beside the reads in order (see
        :mod:`flyte_checkpoint.archive.positional`), where the stream is a file (``os.pread``)
        and the digest is one that pieces read apart can be joined into; else ``None``."""
        if self._digest is not None and not self._digest.joinable:
            return None
        try:
            descriptor = self._stream.fileno() if self._stream.seekable() else None
        except (OSError, ValueError):  # io.UnsupportedOperation is an OSError
            descriptor = None
        return None if descriptor is None else _VerifiedPositionalReads(self, descriptor)

    def _skip(self, length: int, crc: int) -> None:
        # The stream moves past them at the next read in order: a load skips every member of a
        # local object, and a seek for each cost the reading thread a system call per MiB.
        self._skipped += length
        if self._digest is not None:
            self._digest.join_crc32(crc, length)
        self._advance(length)

    def _move_past_skipped(self) -> None:
        if self._skipped:
            self._stream.seek(self._skipped, os.SEEK_CUR)
            self._skipped = 0

    def _advance(self, length: int) -> None:
        """Count ``length`` more bytes of the object as read (and report the progress)."""
        self._size += length
        if self._progress is not None:
            self._progress.advance(self._size)

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)

    def readable(self) -> bool:
        return True

    @property
    def verified(self) -> bool:
        """Whether the whole object was read and matched what was recorded."""
        return self._verified

    def _verify(self) -> None:
        if self._verified:
            return
        try:
            self._check_recorded()
        except CheckpointCorruptError:
            if self._changed_since is not None and self._changed_since():
                raise CheckpointUnavailableError(
                    f"checkpoint {self.info.uri} was replaced while it was being read"
                ) from None
            raise
        self._verified = True

    def _check_recorded(self) -> None:
        expected_size = self.info.recorded_size
        if expected_size is not None and expected_size != self._size:
            raise CheckpointCorruptError(
                f"checkpoint {self.info.uri} is damaged: read {self._size} bytes, but "
                f"{expected_size} were written"
            )
        if self._digest is not None and self._digest.value != self.info.recorded_digest:
            raise CheckpointCorruptError(
                f"checkpoint {self.info.uri} is damaged: its content does not match the digest "
                "recorded when it was saved"
            )

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


class _VerifiedPositionalReads:
    """A file's bytes read at their offsets (``os.pread``, so from any thread), and skipped in
    its :class:`VerifyingReader` with their CRC-32 joined into its digest."""

    def __init__(self, reader: VerifyingReader, descriptor: int) -> None:
        self._reader = reader
        self._descriptor = descriptor

    def consumed(self) -> int:
        return self._reader._size

    def size(self) -> int:
        with self._reader._translate_errors():
            return os.fstat(self._descriptor).st_size

    def read_at(self, offset: int, size: int) -> bytes:
        parts = []
        with self._reader._translate_errors():
            while size > 0 and (data := os.pread(self._descriptor, size, offset)):
                parts.append(data)
                offset += len(data)
                size -= len(data)
        return b"".join(parts)

    def reserve(self, length: int) -> None:
        pass  # the size and the progress count bytes once skipped, in order

    def skip(self, length: int, crc: int) -> None:
        self._reader._skip(length, crc)


class Backend(abc.ABC):
    """One storage system, reached by URI."""

    records_digest_only_when_declared = False
    """True where the digest must be known before the upload starts to be stored with the object
    (S3 and GCS take metadata when the upload begins); callers then declare it up front."""
    keeps_unfinished_uploads = False
    """True where a save killed mid-upload leaves something behind on the store that no later
    save to another object removes (S3's incomplete multipart uploads, GCS's temporary part
    objects): :meth:`discard_unfinished_uploads` removes it."""

    @abc.abstractmethod
    def open_write(
        self,
        uri: str,
        metadata: Mapping[str, str],
        *,
        declared_digest: str | None = None,
        declared_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
    ) -> ObjectWriter:
        """Start an atomic write of one object at ``uri``.

        ``declared_digest``/``declared_size``, when given, are the labelled digest and size the content
        will have; the commit is refused if what was written differs. ``progress`` is told the
        bytes written; with ``gate``, every write first waits until it is set.
        """

    def open_write_known(
        self,
        uri: str,
        metadata: Mapping[str, str],
        content: bytes | io.BufferedReader,
        *,
        progress: ProgressCallback | None = None,
        gate: WriteGate | None = None,
    ) -> ObjectWriter:
        """Start an atomic write of ``content`` whose length is known: bytes, or a regular file
        open for reading at its start (left at its start again).

        Where the store keeps metadata only when an upload begins, the content is digested
        first so the digest travels with the object, and the commit refuses content that
        changed meanwhile (a file rewritten during the upload).
        """
        size = len(content) if isinstance(content, bytes) else os.fstat(content.fileno()).st_size
        digest: str | None = None
        if self.records_digest_only_when_declared:
            if isinstance(content, bytes):
                digest = digest_of(content)
            else:
                running = ContentDigest()
                for chunk in read_chunks(content):
                    running.update(chunk)
                digest = running.value
                content.seek(0)
        return self.open_write(
            uri,
            metadata,
            declared_digest=digest,
            declared_size=size if digest is not None else None,
            progress=reporter(progress, size),
            gate=gate,
        )

    @abc.abstractmethod
    def open_read(self, uri: str, *, progress: ProgressCallback | None = None) -> VerifyingReader | None:
        """Open the object at ``uri`` for streaming, or ``None`` when there is none.

        ``progress(bytes_read, object_size)`` is called as the object is read.
        """

    @abc.abstractmethod
    def info(self, uri: str) -> ObjectInfo | None:
        """Describe the object at ``uri``, or ``None`` when there is none."""

    def copy(self, src: str, dst: str) -> None:
        """Copy one object to another URI of the same backend, atomically at ``dst``."""
        reader = self.open_read(src)
        if reader is None:
            raise FileNotFoundError(src)
        copy_stream(reader, self, dst)

    def discard_unfinished_uploads(self, uri: str) -> int:
        """Abort every unfinished upload to the object at ``uri``; how many there were.

        Only for an object no writer is saving any more (an earlier attempt's checkpoint): a
        save in progress there would fail. The object itself is left as it is. Nothing to do
        where :attr:`keeps_unfinished_uploads` is false.
        """
        return 0

    @abc.abstractmethod
    def delete(self, uri: str) -> None:
        """Remove the object at ``uri``; nothing happens when it is absent."""

    @abc.abstractmethod
    def list_prefix(self, uri: str) -> list[str]:
        """The URIs of all objects below the directory-like prefix ``uri`` (recursive, sorted)."""

    @abc.abstractmethod
    def delete_prefix(self, uri: str) -> None:
        """Remove every object below the directory-like prefix ``uri``; absent is fine."""

    def list_children(self, uri: str) -> list[str]:
        """The names directly below the directory-like prefix ``uri``: objects and sub-prefixes (sorted).

        Derived from :meth:`list_prefix` here; a backend with real directories lists them, so a
        directory holding only an unfinished write is named too.
        """
        base = _without_scheme(uri) + "/"
        names = set()
        for listed in self.list_prefix(uri):
            relative = _without_scheme(listed)
            if relative.startswith(base):
                names.add(relative[len(base) :].split("/", 1)[0])
        return sorted(names)


def _without_scheme(uri: str) -> str:
    # Stores may list under another spelling of the scheme than the one given (az:// vs abfs://).
    return uri.split("://", 1)[-1].strip("/")


def copy_stream(reader: VerifyingReader, backend: Backend, dst: str) -> ObjectInfo:
    """Stream ``reader`` into a new object at ``dst`` on ``backend``, keeping its format record.

    A directory archive keeps its recorded content size too: without it the copy loads as an
    archive of another tool, and a zero-heavy one of ours is refused as a bomb.
    """
    metadata = {}
    if reader.info.recorded_format:
        metadata[FORMAT_KEY] = reader.info.recorded_format
    content_size = reader.info.recorded_content_size
    if content_size is not None:
        metadata[CONTENT_SIZE_KEY] = str(content_size)
    digest = reader.info.recorded_digest
    size = reader.info.size if digest else None
    with reader, backend.open_write(dst, metadata, declared_digest=digest, declared_size=size) as writer:
        writer.write_from(reader)
    return ObjectInfo(uri=dst, size=writer.tell(), metadata=writer.metadata)
