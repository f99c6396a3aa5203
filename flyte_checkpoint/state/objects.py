"""Moving one part, one record, to and from storage, with digests checked by this layer.

The digests checked on load are the ones in the manifest, not whatever the backend recorded,
so a part is verified on every backend, including object stores that keep no metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flyte_checkpoint.errors import CheckpointCorruptError
from flyte_checkpoint.progress import CombinedProgress
from flyte_checkpoint.state.components import Payload
from flyte_checkpoint.state.manifest import PartRecord
from flyte_checkpoint.storage import DIGEST_KEY, Backend
from flyte_checkpoint.storage.digests import ContentDigest
from flyte_checkpoint.storage.retry import RetryPolicy

_CHUNK = 1 << 20
RETRY = RetryPolicy()
"""Transient storage failures (timeouts, resets, throttling) are retried a bounded number of
times; everything this layer writes is restartable, because payloads are bytes or private files."""


@dataclass(frozen=True)
class Written:
    size: int
    digest: str


def write_object(
    backend: Backend, uri: str, payload: Payload, progress: CombinedProgress | None = None
) -> Written:
    """Store ``payload`` at ``uri`` atomically (nothing visible before commit), with retries."""
    return RETRY.call(lambda: _write_once(backend, uri, payload, progress), describe=f"saving {uri}")


def _write_once(backend: Backend, uri: str, payload: Payload, progress: CombinedProgress | None) -> Written:
    writer = backend.open_write(uri, {}, progress=progress.writer_part() if progress is not None else None)
    try:
        if isinstance(payload.data, Path):
            with payload.data.open("rb") as source:
                writer.write_from(source)
        else:
            writer.write(payload.data)
    except BaseException:
        writer.abort()
        raise
    info = writer.commit()
    return Written(size=info.size, digest=info.metadata[DIGEST_KEY])


def write_record(backend: Backend, uri: str, data: bytes) -> Written:
    """Store a small JSON record atomically."""
    return write_object(backend, uri, Payload(data, "json"))


def read_record(backend: Backend, uri: str) -> bytes | None:
    """The bytes of a small record, or ``None`` when it does not exist."""
    return RETRY.call(lambda: _read_all(backend, uri), describe=f"loading {uri}")


def _read_all(backend: Backend, uri: str) -> bytes | None:
    reader = backend.open_read(uri)
    if reader is None:
        return None
    with reader:
        return reader.readall()


def fetch_bytes(
    backend: Backend, uri: str, record: PartRecord, label: str, progress: CombinedProgress | None = None
) -> bytes:
    """The object ``record`` describes, checked against the manifest's size and digest."""

    def once() -> bytes:
        chunks: list[bytes] = []
        _stream(backend, uri, record, label, chunks.append, progress)
        return b"".join(chunks)

    return RETRY.call(once, describe=f"loading {uri}")


def fetch_to_file(
    backend: Backend,
    uri: str,
    record: PartRecord,
    label: str,
    dest: Path,
    progress: CombinedProgress | None = None,
) -> Path:
    """Stream the object ``record`` describes into ``dest``, checked like :func:`fetch_bytes`."""

    def once() -> Path:
        with dest.open("wb") as sink:
            _stream(backend, uri, record, label, sink.write, progress)
        return dest

    return RETRY.call(once, describe=f"loading {uri}")


def verify_object(backend: Backend, uri: str, record: PartRecord, label: str) -> None:
    """Read the object ``record`` describes to its end, checking it, and keep nothing."""
    RETRY.call(lambda: _stream(backend, uri, record, label, lambda _: None), describe=f"loading {uri}")


def _stream(
    backend: Backend,
    uri: str,
    record: PartRecord,
    label: str,
    consume: Callable[[bytes], object],
    progress: CombinedProgress | None = None,
) -> None:
    """Read the object to its end into ``consume``, digesting each byte once.

    Where the backend recorded a digest with the object, its reader already checks the bytes
    against it at end of stream; that recorded digest must then be the manifest's, and no second
    digest is taken here. Otherwise this layer digests the bytes itself.
    """
    reader = backend.open_read(uri, progress=progress.reader_part() if progress is not None else None)
    if reader is None:
        raise CheckpointCorruptError(f"{label} is missing: the manifest names {uri}, which does not exist")
    recorded = reader.info.recorded_digest
    digest = None if recorded is not None else ContentDigest.like(record.digest, where=f"{label} ({uri})")
    size = 0
    with reader:
        if recorded is not None and recorded != record.digest:
            raise CheckpointCorruptError(_mismatch(label, uri))
        while True:
            try:
                chunk = reader.read(_CHUNK)
            except CheckpointCorruptError as exc:
                # The reader's own check at end of stream, against the digest it recorded.
                raise CheckpointCorruptError(_mismatch(label, uri)) from exc
            if not chunk:
                break
            size += len(chunk)
            if size > record.size:
                raise CheckpointCorruptError(
                    f"{label} is damaged: {uri} holds more than the {record.size} bytes recorded"
                )
            if digest is not None:
                digest.update(chunk)
            consume(chunk)
    if size != record.size:
        raise CheckpointCorruptError(
            f"{label} is damaged: {uri} holds {size} bytes, but {record.size} were recorded"
        )
    if digest is not None and digest.value != record.digest:
        raise CheckpointCorruptError(_mismatch(label, uri))


def _mismatch(label: str, uri: str) -> str:
    return f"{label} is damaged: the content of {uri} does not match the digest in the manifest"
