"""The one path by which a single checkpoint object is saved and loaded.

Encoding (bytes, a file, or a directory packed as one streamed ``.tar.gz``) into an atomic
:class:`~flyte_checkpoint.storage.ObjectWriter`, decoding (classify the object, unpack an archive
or write a payload), the empty-object rule and the retries all live here, once.
:class:`~flyte_checkpoint.Checkpoint`, :mod:`flyte_checkpoint.single.inspection` (and so the command
line) and :mod:`flyte_checkpoint.state` use these functions, so how bytes move (a parallel
transport, say) changes in :mod:`flyte_checkpoint.storage` only.

What a save needs beyond its destination travels in one frozen :class:`SaveRequest`; progress
callbacks and a background save's pause gate are fields of it and arguments to the backend,
never attributes set on a writer or reader afterwards.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, TypeVar, cast

from flyte_checkpoint import archive
from flyte_checkpoint.archive import ExtractionLimits, ObjectKind
from flyte_checkpoint.errors import CheckpointCorruptError, InputChangedError, add_context
from flyte_checkpoint.incremental import (
    MANIFEST_FORMAT,
    ChunkStore,
    IncrementalSave,
    is_manifest_head,
    restore_directory,
    save_directory,
)
from flyte_checkpoint.progress import ProgressCallback, log_transfer, reporter
from flyte_checkpoint.storage import FORMAT_KEY, Backend, ObjectInfo, ObjectWriter, VerifyingReader
from flyte_checkpoint.storage.base import CONTENT_SIZE_KEY, COPY_CHUNK, CommitTurn, WriteGate
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.storage.retry import RetryPolicy

logger = logging.getLogger("flyte_checkpoint")

T = TypeVar("T")

StoredKind = ObjectKind | Literal["manifest"]
"""What a checkpoint object holds: a directory archive, a payload, or an incremental manifest."""

PAYLOAD_BASENAME = "payload"
"""The file name under the restore directory where a raw (non-archive) object is placed."""

DEFAULT_RETRY = RetryPolicy()


# -- saving ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SaveRequest:
    """One object to save and how: built by the caller once, read by :func:`save` as it is.

    ``progress(bytes_written, total)`` is told how far the upload got (``total`` is ``None``
    for a directory); with ``gate`` every write first waits until it is set (a background
    save's pause). ``check_unchanged`` runs after the last byte is written and before the
    commit: raising there discards the upload and keeps the previous object. ``shown_as`` is
    the path that logs and errors name instead of ``content`` (the caller's own path when
    ``content`` is a private snapshot of it). ``commit_turn`` is entered just before the
    store's atomic commit step and held across it (a helper's :meth:`CommitOrder.turn`):
    raising there discards the upload as well. With ``chunk_store`` a directory is saved
    incrementally into it (:mod:`flyte_checkpoint.incremental`): its manifest is the object.
    """

    content: bytes | Path
    compression_level: int = archive.DEFAULT_COMPRESSION_LEVEL
    progress: ProgressCallback | None = None
    gate: WriteGate | None = None
    check_unchanged: Callable[[], None] | None = None
    shown_as: Path | None = None
    commit_turn: CommitTurn | None = None
    chunk_store: ChunkStore | None = None

    def describe(self) -> str:
        """``"bytes"``, or ``"file …"``/``"directory …"`` with the caller's path, for logs."""
        if isinstance(self.content, bytes):
            return "bytes"
        kind = "directory" if self.content.is_dir() else "file"
        return f"{kind} {self.shown_as or self.content}"


def save_object(
    backend: Backend,
    uri: str,
    content: bytes | Path,
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    compression_level: int = archive.DEFAULT_COMPRESSION_LEVEL,
    progress: ProgressCallback | None = None,
) -> ObjectInfo:
    """Store ``content`` as the one object at ``uri``, atomically, retrying transient failures.

    ``bytes`` become the object as they are, a file is uploaded as it is, a directory as one
    ``.tar.gz`` of its immediate children, streamed. See :class:`SaveRequest` for the rest.
    """
    request = SaveRequest(content=content, compression_level=compression_level, progress=progress)
    return save(backend, uri, request, retry=retry)


def save(
    backend: Backend, uri: str, request: SaveRequest, *, retry: RetryPolicy = DEFAULT_RETRY
) -> ObjectInfo:
    """Perform ``request`` at ``uri``: one atomic object, each whole attempt retried by ``retry``."""
    started = time.monotonic()
    what = request.describe()
    info = retry.call(lambda: _save_once(backend, uri, request), describe=f"saving {uri}")
    log_transfer("saved", uri, what, info.size, started)
    return info


def _save_once(backend: Backend, uri: str, request: SaveRequest) -> ObjectInfo:
    content, progress, gate = request.content, request.progress, request.gate
    check_unchanged, commit_turn = request.check_unchanged, request.commit_turn
    shown_as = request.shown_as or content
    if isinstance(content, bytes):
        writer = backend.open_write_known(uri, {FORMAT_KEY: "payload"}, content, progress=progress, gate=gate)
        return _committed(writer, lambda: writer.write(content), check_unchanged, commit_turn)
    if content.is_dir() and request.chunk_store is not None:
        how = IncrementalSave(request.chunk_store, progress, gate, check_unchanged, commit_turn)
        return save_directory(backend, uri, content, how)
    if content.is_dir():
        told = reporter(progress, None)
        # Known before the first byte: S3 takes an upload's metadata when it starts. Its OS
        # errors (a path over PATH_MAX, a file vanishing) reach the caller's snapshot, which
        # names the caller's path, as those of the pack itself do.
        unpacked = archive.content_size(content)
        metadata = {FORMAT_KEY: "archive", CONTENT_SIZE_KEY: str(unpacked)}
        writer = backend.open_write(uri, metadata, progress=told, gate=gate)
        directory, level = content, request.compression_level

        def pack() -> None:
            archive.pack_directory(directory, cast(IO[bytes], writer), level=level)

        return _committed(writer, pack, check_unchanged, commit_turn)
    with translated_os_errors(str(shown_as), "reading"), open(content, "rb") as source:
        writer = backend.open_write_known(uri, {FORMAT_KEY: "payload"}, source, progress=progress, gate=gate)
        opened = _version_of(source)
        named = shown_as if isinstance(shown_as, Path) else content

        def check() -> None:
            if check_unchanged is not None:
                check_unchanged()
            if _version_of(source) != opened:
                raise InputChangedError(
                    f"{named} was modified while it was being saved (its size or modification "
                    "time changed), so what was read may mix two versions; the save was discarded "
                    "and the previous checkpoint kept. Write the new file under another name and "
                    "rename it over the old one (os.replace), or save only once writing is done"
                )

        try:
            return _committed(writer, lambda: writer.write_from(source), check, commit_turn)
        except InputChangedError as exc:
            if isinstance(shown_as, Path) and shown_as != content:  # it names the private snapshot read
                add_context(exc, f"{content} is the snapshot of {shown_as} this save was reading")
            raise


def _version_of(source: IO[bytes]) -> tuple[int, int]:
    """Size and modification time of the open file: a writer truncating or rewriting it (as
    ``torch.save`` to the same name does) moves them, a rename over its name does not (the
    open file is still the old, whole one)."""
    status = os.fstat(source.fileno())
    return status.st_size, status.st_mtime_ns


def _committed(
    writer: ObjectWriter,
    fill: Callable[[], object],
    check_unchanged: Callable[[], None] | None,
    commit_turn: CommitTurn | None,
) -> ObjectInfo:
    """Fill ``writer``, check the input, commit in ``commit_turn``; on any failure before the
    commit (interrupts too) abort instead."""
    try:
        fill()
        if check_unchanged is not None:
            check_unchanged()
    except BaseException:
        writer.abort()
        raise
    return writer.commit(turn=commit_turn)


# -- loading ---------------------------------------------------------------------------------


def holds_checkpoint(info: ObjectInfo) -> bool:
    """The empty-object rule: an empty object means "no checkpoint", as in the reference SDK.

    Raises :class:`CheckpointCorruptError` for an object that is empty although the bytes
    recorded when it was written were not: it was damaged, not written empty.
    """
    if info.size:
        return True
    recorded = info.recorded_size
    if recorded:
        raise CheckpointCorruptError(
            f"checkpoint {info.uri} is damaged: it is empty, but {recorded} bytes were written; "
            "delete it to start fresh or point the source at a sound copy"
        )
    return False


def read_object(
    backend: Backend,
    uri: str,
    use: Callable[[VerifyingReader], T],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    progress: ProgressCallback | None = None,
) -> T | None:
    """Open the object at ``uri`` and return ``use(reader)``; ``None`` when there is no object.

    A transient failure anywhere (opening or in ``use``) starts the whole read over, within
    ``retry``'s budget, so ``use`` must be restartable. ``progress(bytes_read, size)`` is told
    how far the read got.
    """

    def once() -> T | None:
        reader = backend.open_read(uri, progress=progress)
        if reader is None:
            return None
        with reader:
            return use(reader)

    return retry.call(once, describe=f"loading {uri}")


def load_object(
    backend: Backend,
    uri: str,
    dest: Path,
    *,
    reset: Callable[[], None],
    limits: ExtractionLimits | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    progress: ProgressCallback | None = None,
) -> Path | None:
    """Restore the object at ``uri`` into the directory ``dest``; ``None`` when there is none.

    Returns ``dest`` for a directory archive and ``dest / "payload"`` for a raw object. An
    absent or empty object (:func:`holds_checkpoint`) is "no checkpoint". ``reset()`` must empty
    ``dest``: it runs before anything is written and after a failure, so a failed or retried
    load leaves nothing behind. The object is read to its end, so its digest (and a gzip CRC)
    is checked before this returns.
    """
    started = time.monotonic()
    read: list[int] = []

    def restore(reader: VerifyingReader) -> Path | None:
        if not holds_checkpoint(reader.info):
            return None
        read[:] = [reader.info.size]
        reset()
        try:
            return _unpack(backend, reader, dest, limits or ExtractionLimits())
        except BaseException:
            reset()
            raise

    restored = read_object(backend, uri, restore, retry=retry, progress=progress)
    if restored is None:
        logger.info("no checkpoint at %s (no object, or an empty one); starting fresh", uri)
        return None
    log_transfer("loaded", uri, f"into {restored}", read[0], started)
    return restored


def classify(reader: VerifyingReader) -> tuple[StoredKind, bool, IO[bytes]]:
    """The object's kind, whether it is gzipped, and the stream to read it from (from byte 0).

    ``"manifest"`` is an incremental checkpoint's manifest (:mod:`flyte_checkpoint.incremental`).

    The format recorded at save time wins; objects without a record (written by other tools)
    are recognised from their first bytes, as the reference SDK does.
    """
    recorded = reader.info.recorded_format
    stream = cast(IO[bytes], reader)
    if recorded == MANIFEST_FORMAT:
        return "manifest", False, stream
    if recorded == "archive":
        return "archive", True, stream
    if recorded == "payload":
        return "payload", False, stream
    head = reader.read(archive.SNIFF_BYTES)
    sniffed: tuple[StoredKind, bool] = (
        ("manifest", False) if is_manifest_head(head) else archive.sniff_kind(head)
    )
    return *sniffed, cast(IO[bytes], io.BufferedReader(archive.PrefixedReader(head, stream)))


def _unpack(backend: Backend, reader: VerifyingReader, dest: Path, limits: ExtractionLimits) -> Path:
    kind, compressed, stream = classify(reader)
    restoring = f"restoring {reader.info.uri} into"
    try:
        if kind == "manifest":
            return restore_directory(backend, reader.info.uri, stream, dest, limits)
        if kind == "archive":
            with translated_os_errors(str(dest), restoring):
                limits = limits.for_recorded(reader.info.recorded_content_size)
                archive.unpack_archive(stream, dest, compressed=compressed, limits=limits)
            return dest
        # classify hands out the reader itself or a BufferedReader over it: both read into buffers.
        readable = cast(io.RawIOBase | io.BufferedIOBase, stream)
        return _write_payload(readable, dest / PAYLOAD_BASENAME, restoring)
    except CheckpointCorruptError as exc:
        add_context(
            exc,
            "nothing was restored; delete the object or point the source at a sound copy",
            uri=reader.info.uri,
        )
        raise


def _write_payload(stream: io.RawIOBase | io.BufferedIOBase, target: Path, restoring: str) -> Path:
    """Copy the whole stream to ``target`` via a temp name, so a failed read leaves no payload."""
    partial = target.with_name(f".{target.name}.partial")
    # One buffer filled in place: a fresh MiB per read would be faulted in and zeroed each time.
    buffer = memoryview(bytearray(COPY_CHUNK))
    with translated_os_errors(str(target), restoring), open(partial, "wb") as out:
        while count := stream.readinto(buffer):
            out.write(buffer[:count])
    os.replace(partial, target)
    return target
