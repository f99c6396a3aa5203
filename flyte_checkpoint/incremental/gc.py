"""Garbage collection of a chunk store: remove the chunks no live checkpoint references.

What is live, and so never removed:

* every chunk a manifest among ``live`` references: the caller names them (a helper names its
  destination, its restore source and the same checkpoint of every earlier attempt it would
  walk back to, so neither a live checkpoint nor the resume source can lose a chunk);
* every chunk listed by a pending marker younger than ``pending_expiry``: a save writes its
  marker before it reads the condemned record or looks for or uploads any chunk, and removes
  it after its manifest committed, so the chunks of a save in progress are kept even though
  no manifest names them yet.

A chunk is deleted in two collections, never in one (the two-phase rule). The first that finds
it unreferenced only condemns it: it writes the store's condemned record
(:mod:`.condemned`, replaced atomically) naming it with its modification time. A later
collection, once that record is older than ``grace``, deletes the chunks the record names that
are still unreferenced (markers and manifests read again) and whose modification time, asked
again after that reading, is still the recorded one; then it writes a new record of what is
unreferenced now and was not deleted. A collection finding the record younger than ``grace``
changes nothing (replacing it would restart the wait, so collections run more often than the
grace period would never delete anything).

Why no save loses a chunk: a save reads the record after writing its marker and uploads again
every condemned chunk it needs (content-addressed, so the overwrite is harmless, and it changes
the chunk's modification time). So a save that reuses chunk X without uploading it read a record
older than the one condemning X, which means its marker was written before the collection
that deletes X started: that collection sees its marker, or its manifest if it committed, and
keeps X. A save that uploads X again keeps it by the new modification time. The order within
a collection is fixed: chunks listed, markers read, manifests read, modification times asked
again, deletions, record written. What is left is a save uploading a condemned chunk again in
the instant between that last question and the deletion; and collections of one store running
concurrently with each other (each replaces the record), which a helper never does.

``grace`` = 0 keeps the two phases but not the wait: for tests and single-process use.
A marker older than ``pending_expiry`` belongs to a save that was killed: it is removed.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from flyte_checkpoint.archive import ExtractionLimits
from flyte_checkpoint.errors import CheckpointCorruptError
from flyte_checkpoint.incremental.chunks import ChunkStore, parallel
from flyte_checkpoint.incremental.condemned import read_condemned, write_condemned
from flyte_checkpoint.incremental.layout import CHUNKS, PENDING, digest_of_chunk_uri
from flyte_checkpoint.incremental.manifest import MANIFEST_FORMAT, is_manifest_head, read_manifest
from flyte_checkpoint.storage import Backend, ObjectInfo

logger = logging.getLogger("flyte_checkpoint")

DEFAULT_GRACE = datetime.timedelta(hours=1)
DEFAULT_PENDING_EXPIRY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CollectedGarbage:
    """What a collection did: chunks removed (and their bytes), and chunks kept."""

    removed: int
    removed_bytes: int
    kept: int


def collect_garbage(
    backend: Backend,
    store: ChunkStore,
    live: Iterable[str],
    *,
    grace: datetime.timedelta = DEFAULT_GRACE,
    pending_expiry: datetime.timedelta = DEFAULT_PENDING_EXPIRY,
    now: datetime.datetime | None = None,
) -> CollectedGarbage:
    """Remove the chunks of ``store`` that no manifest in ``live`` (URIs) references; see the module.

    A URI in ``live`` holding nothing, or a single-object checkpoint, references nothing; a
    manifest that cannot be read stops the collection (with the error) before anything is removed.
    """
    now = now or datetime.datetime.now(datetime.timezone.utc)
    record = read_condemned(backend, store.uri)
    if record.written is not None and now - record.written <= grace:
        # Too young to act on; it is not replaced either, or collections run more often than
        # the grace period would never delete anything.
        _remove_expired_markers(backend, store, now, pending_expiry)
        held = [uri for uri in backend.list_prefix(f"{store.uri}/{CHUNKS}") if digest_of_chunk_uri(uri)]
        return CollectedGarbage(removed=0, removed_bytes=0, kept=len(held))
    chunks = [
        info for info in _infos(backend, f"{store.uri}/{CHUNKS}", store) if digest_of_chunk_uri(info.uri)
    ]
    referenced: set[str] = set()
    for marker in _remove_expired_markers(backend, store, now, pending_expiry):
        referenced |= _listed_by_marker(backend, marker.uri)
    for uri in live:
        referenced |= _referenced_by(backend, uri)
    unreferenced = [info for info in chunks if _digest(info) not in referenced]
    candidates = [info for info in unreferenced if _digest(info) in record.chunks]
    # Asked again now, after the markers and manifests were read: a save that found a chunk
    # condemned uploads it again, which changes its modification time, and so keeps it.
    fresh = parallel(lambda info: backend.info(info.uri), candidates, store.workers)
    doomed = [
        info
        for info in fresh
        if info is not None
        and info.modified is not None
        and info.modified == record.chunks.get(_digest(info))
    ]
    parallel(lambda info: backend.delete(info.uri), doomed, store.workers)
    gone = {_digest(info) for info in doomed}
    condemned = {
        _digest(info): info.modified
        for info in unreferenced
        if info.modified is not None and _digest(info) not in gone
    }
    write_condemned(backend, store.uri, condemned)
    removed_bytes = sum(info.size for info in doomed)
    if doomed:
        logger.info(
            "removed %d unreferenced chunks (%d bytes) from %s", len(doomed), removed_bytes, store.uri
        )
    return CollectedGarbage(removed=len(doomed), removed_bytes=removed_bytes, kept=len(chunks) - len(doomed))


def _digest(info: ObjectInfo) -> str:
    return digest_of_chunk_uri(info.uri) or ""


def _remove_expired_markers(
    backend: Backend, store: ChunkStore, now: datetime.datetime, pending_expiry: datetime.timedelta
) -> list[ObjectInfo]:
    """Remove the markers older than ``pending_expiry`` (saves that were killed); the others."""
    kept = []
    for marker in _infos(backend, f"{store.uri}/{PENDING}", store):
        if marker.modified is not None and now - marker.modified > pending_expiry:
            logger.info("removing the marker %s of a save that did not finish", marker.uri)
            backend.delete(marker.uri)
        else:
            kept.append(marker)
    return kept


def _infos(backend: Backend, prefix: str, store: ChunkStore) -> list[ObjectInfo]:
    listed = backend.list_prefix(prefix)
    found = parallel(backend.info, listed, store.workers)
    return [info for info in found if info is not None]


def _referenced_by(backend: Backend, uri: str) -> set[str]:
    reader = backend.open_read(uri)
    if reader is None:
        return set()
    with reader:
        head = reader.read(64)
        if reader.info.recorded_format != MANIFEST_FORMAT and not is_manifest_head(head):
            return set()
        # A manifest too large to read fails the collection: skipping it could remove chunks
        # that a live checkpoint needs.
        manifest = read_manifest(reader, uri, ExtractionLimits().max_manifest_bytes, head)
    # Not compared with the store's location (spellings differ: a path, file://): keeping the
    # chunks of a manifest that uses another store is only a missed removal, never a loss.
    return manifest.digests()


def _listed_by_marker(backend: Backend, uri: str) -> set[str]:
    reader = backend.open_read(uri)
    if reader is None:
        return set()  # the save finished meanwhile: its manifest is what counts now
    with reader:
        data = reader.readall()
    try:
        listed = json.loads(data)
    except ValueError:
        listed = None
    if not isinstance(listed, list):  # valid JSON of another shape (null, 5) is damage too
        raise CheckpointCorruptError(
            f"pending-save marker {uri} is damaged; delete it, then collect garbage again"
        )
    return {digest for digest in listed if isinstance(digest, str)}
