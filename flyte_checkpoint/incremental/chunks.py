"""The chunk store of one checkpoint: content-addressed chunks, hashed, checked, moved in parallel.

A chunk is a fixed-size piece of a file (the whole file when it is smaller), stored once under
its SHA-256 (:func:`~.layout.chunk_uri`), whoever saved it and whenever: a save uploads only the
chunks the store does not hold yet, and a load checks each chunk it reads against its name.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from flyte_checkpoint.errors import CheckpointChunkError, InputChangedError
from flyte_checkpoint.incremental.layout import chunk_uri
from flyte_checkpoint.incremental.manifest import DEFAULT_CHUNK_SIZE, ChunkRef
from flyte_checkpoint.storage import FORMAT_KEY, Backend, ObjectInfo
from flyte_checkpoint.storage.base import CommitTurn
from flyte_checkpoint.storage.errors import translated_os_errors

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_WORKERS = 8
"""Chunks hashed, looked up, uploaded or fetched at once (each holds one chunk in memory)."""
KEPT_FOR_UPLOAD = 128 << 20
"""Bytes of newly hashed chunks a save keeps in memory to upload without reading them again."""
CHUNK_FORMAT = "payload"
"""A chunk's recorded format: its bytes as they are."""

_FileVersion = tuple[int, int, int, int, int]
"""What says a file is unchanged since it was hashed: device, inode, size, mtime, chunk size."""


def parallel(work: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``work`` of every item, ``workers`` at a time, in order; the first failure is raised.

    Each item runs in a copy of the caller's context: a save's time bound after a preemption
    notice (:func:`~flyte_checkpoint.storage.deadline.finish_by`) bounds its chunks too.
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(
        max_workers=min(workers, len(items)), thread_name_prefix="flyte-cp-chunk"
    ) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, item) for item in items]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()  # the rest would only be discarded: do not start them
            raise


class ReadChunks:
    """Chunks one save read while hashing them, kept (up to ``budget`` bytes) for its uploads.

    A kept chunk is uploaded from the very bytes its hash was computed from, so it is neither
    read nor hashed a second time; a chunk not kept is read again and checked against its hash.
    """

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._kept: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def offer(self, digest: str, piece: bytes) -> None:
        """Keep ``piece`` (whose SHA-256 is ``digest``) if the budget allows."""
        with self._lock:
            if digest not in self._kept and len(piece) <= self._budget:
                self._kept[digest] = piece
                self._budget -= len(piece)

    def take(self, digest: str) -> bytes | None:
        """The kept chunk ``digest``, given up by this object; ``None`` if it was not kept."""
        with self._lock:
            return self._kept.pop(digest, None)


class ChunkStore:
    """The chunk store at ``uri`` (see :func:`~.layout.chunk_store_for`), as one helper uses it.

    It remembers the chunks of the files it hashed, by device, inode, size and modification
    time (what the single-object save also takes for a file's version), so a save re-reads only
    the files that changed since the helper's last save. Whether a chunk is stored is asked of
    the store every save, never remembered: garbage collection may have removed it since.
    """

    def __init__(
        self,
        uri: str,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        workers: int = DEFAULT_WORKERS,
        kept_for_upload: int = KEPT_FOR_UPLOAD,
    ) -> None:
        if chunk_size <= 0 or workers <= 0 or kept_for_upload < 0:
            raise ValueError("chunk_size and workers must be positive, kept_for_upload not negative")
        self.uri = uri.rstrip("/")
        self.chunk_size = chunk_size
        self.workers = workers
        self.kept_for_upload = kept_for_upload
        """Bytes of newly hashed chunks a save keeps in memory for its uploads (:class:`ReadChunks`)."""
        self._hashed: dict[_FileVersion, tuple[ChunkRef, ...]] = {}
        self._lock = threading.Lock()
        self._uploaded = 0

    @property
    def uploaded_bytes(self) -> int:
        """Chunk bytes this object uploaded so far, over all saves (what a save cost the network)."""
        return self._uploaded

    def __repr__(self) -> str:
        return f"ChunkStore({self.uri!r})"

    def chunk_uri(self, digest: str) -> str:
        """The object holding the chunk ``digest``."""
        return chunk_uri(self.uri, digest)

    # -- saving -------------------------------------------------------------------------------

    def _version(self, status: os.stat_result) -> _FileVersion:
        return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, self.chunk_size)

    def chunks_of(
        self, path: str, status: os.stat_result, read: ReadChunks | None = None
    ) -> tuple[ChunkRef, ...]:
        """The chunks of the file at ``path`` (``status`` its lstat), hashed unless unchanged;
        what is hashed is offered to ``read``."""
        version = self._version(status)
        with self._lock:
            known = self._hashed.get(version)
        if known is not None:
            return known
        refs = []
        with translated_os_errors(path, "reading"), open(path, "rb") as source:
            while piece := source.read(self.chunk_size):
                refs.append(ChunkRef(sha256=hashlib.sha256(piece).hexdigest(), size=len(piece)))
                if read is not None:
                    read.offer(refs[-1].sha256, piece)
            # Another file renamed over it keeps its name and may keep its mtime (cp -p): the
            # file read must be the one walked, at the size listed, and unchanged since.
            read_bytes = sum(ref.size for ref in refs)
            if self._version(os.fstat(source.fileno())) != version or read_bytes != status.st_size:
                raise _changed(path)
        found = tuple(refs)
        with self._lock:
            self._hashed[version] = found
        return found

    def forget_all_but(self, statuses: Iterable[os.stat_result]) -> None:
        """Keep the hashes of these files only (those of the newest save): memory stays bounded
        by one tree, however many files a run ever wrote."""
        keep = {self._version(status) for status in statuses}
        with self._lock:
            self._hashed = {version: refs for version, refs in self._hashed.items() if version in keep}

    def missing(self, backend: Backend, digests: Iterable[str]) -> set[str]:
        """Those of ``digests`` the store does not hold (one metadata request each, in parallel)."""
        ordered = sorted(set(digests))
        held = parallel(
            lambda digest: backend.info(self.chunk_uri(digest)) is not None, ordered, self.workers
        )
        return {digest for digest, present in zip(ordered, held, strict=True) if not present}

    def upload(
        self, backend: Backend, path: str, index: int, ref: ChunkRef, read: ReadChunks | None = None
    ) -> None:
        """Store chunk ``index`` of the file at ``path`` (kept in ``read``, or read again and
        checked to still hash to ``ref``)."""
        piece = read.take(ref.sha256) if read is not None else None
        if piece is None:
            with translated_os_errors(path, "reading"), open(path, "rb") as source:
                source.seek(index * self.chunk_size)
                piece = source.read(self.chunk_size)
            if len(piece) != ref.size or hashlib.sha256(piece).hexdigest() != ref.sha256:
                raise _changed(path)
        put_object(backend, self.chunk_uri(ref.sha256), piece, CHUNK_FORMAT)
        with self._lock:
            self._uploaded += ref.size

    # -- loading ------------------------------------------------------------------------------

    def fetch(self, backend: Backend, ref: ChunkRef, *, needed_by: str) -> bytes:
        """The bytes of chunk ``ref``, checked against its hash; ``needed_by`` names the file."""
        uri = self.chunk_uri(ref.sha256)
        reader = backend.open_read(uri)
        if reader is None:
            raise CheckpointChunkError(
                f"chunk {uri} of {needed_by!r} is missing from the chunk store, so the checkpoint "
                "cannot be restored; it was deleted outside flyte_checkpoint or by a garbage "
                "collection that was told of too few live checkpoints. Point the source at an "
                "earlier checkpoint or delete this one to start fresh"
            )
        with reader:
            # An object of another size is damaged whatever it holds: refused before it is read
            # into memory (a chunk of 16 MiB could have been replaced by gigabytes).
            piece = reader.readall() if reader.info.size == ref.size else b""
        if len(piece) != ref.size or hashlib.sha256(piece).hexdigest() != ref.sha256:
            raise CheckpointChunkError(
                f"chunk {uri} of {needed_by!r} is damaged: its content does not match the SHA-256 "
                "it is stored under, so the checkpoint cannot be restored; delete the chunk (a "
                "later save of the same content stores it again) and point the source at an "
                "earlier checkpoint, or delete this one to start fresh"
            )
        return piece


def put_object(
    backend: Backend, uri: str, data: bytes, fmt: str, *, turn: CommitTurn | None = None
) -> ObjectInfo:
    """Store ``data`` as the object at ``uri`` (recorded format ``fmt``), atomically; commit in ``turn``."""
    writer = backend.open_write_known(uri, {FORMAT_KEY: fmt}, data)
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    return writer.commit(turn=turn)


def _changed(path: str) -> InputChangedError:
    return InputChangedError(
        f"{path} was modified while it was being saved, so what was read may mix two versions; "
        "the save was discarded and the previous checkpoint kept. Write new files under another "
        "name and rename them into place (os.replace), or save only once writing is done"
    )
