"""Garbage collection of a chunk store: remove the chunks no live checkpoint references.

What is live, and so never removed:

* every chunk a manifest among ``live`` references: the caller names them (a helper names its
  destination, its restore source and the same checkpoint of every earlier attempt it would
  walk back to, so neither a live checkpoint nor the resume source can lose a chunk);
* every chunk listed by a pending marker younger than ``pending_expiry``: a save writes its
  marker before it looks for or uploads any chunk and removes it after its manifest committed,
  so the chunks of a save in progress (uploaded, or found and about to be referenced) are kept
  even though no manifest names them yet;
* every chunk younger than ``grace``: a last guard for saves whose marker is older than the
  listing (clock skew between the store and this process, a store listing late).

The order matters and is fixed: chunks are listed first, then the markers are read, then the
manifests, then unreferenced old chunks are deleted. A save whose marker was listed is
covered whatever it does next; one that commits its manifest before the manifests are read is
covered by its manifest; one that starts later uploads only chunks younger than ``grace``,
apart from chunks it finds already stored. So the one case left is a save that starts after
the markers were read and reuses an unreferenced chunk older than ``grace`` in the seconds
before this collection deletes it; a helper never runs its collection concurrently with its
own saves, which leaves a concurrent process saving the same checkpoint (a zombie attempt).

A marker older than ``pending_expiry`` belongs to a save that was killed: it is removed.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from flyte_checkpoint.errors import CheckpointCorruptError
from flyte_checkpoint.incremental.chunks import ChunkStore, parallel
from flyte_checkpoint.incremental.layout import CHUNKS, PENDING, digest_of_chunk_uri
from flyte_checkpoint.incremental.manifest import MANIFEST_FORMAT, is_manifest_head, parse_manifest
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
    chunks = [
        info for info in _infos(backend, f"{store.uri}/{CHUNKS}", store) if digest_of_chunk_uri(info.uri)
    ]
    referenced: set[str] = set()
    now = now or datetime.datetime.now(datetime.timezone.utc)
    for marker in _infos(backend, f"{store.uri}/{PENDING}", store):
        if marker.modified is not None and now - marker.modified > pending_expiry:
            logger.info("removing the marker %s of a save that did not finish", marker.uri)
            backend.delete(marker.uri)
            continue
        referenced |= _listed_by_marker(backend, marker.uri)
    for uri in live:
        referenced |= _referenced_by(backend, uri)
    doomed = [
        info
        for info in chunks
        if digest_of_chunk_uri(info.uri) not in referenced
        and info.modified is not None
        and now - info.modified > grace
    ]
    parallel(lambda info: backend.delete(info.uri), doomed, store.workers)
    removed_bytes = sum(info.size for info in doomed)
    if doomed:
        logger.info(
            "removed %d unreferenced chunks (%d bytes) from %s", len(doomed), removed_bytes, store.uri
        )
    return CollectedGarbage(removed=len(doomed), removed_bytes=removed_bytes, kept=len(chunks) - len(doomed))


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
        manifest = parse_manifest(head + reader.readall(), uri)
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
