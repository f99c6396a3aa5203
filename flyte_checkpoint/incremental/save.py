"""An incremental directory save: upload the chunks the store lacks, then commit the manifest.

The steps, in this order (garbage collection relies on it, see :mod:`.gc`):

1. walk the tree (refusing what a directory archive refuses) and hash every file that changed
   since this helper last hashed it;
2. write a pending marker listing every chunk the manifest will reference;
3. read the store's condemned record (:mod:`.condemned`), ask the store which chunks it lacks
   (in parallel) and upload those and the condemned ones (in parallel): from
   the bytes step 1 hashed while they fit :attr:`ChunkStore.kept_for_upload`, else read again
   and checked against the hash, so a file rewritten meanwhile fails the save;
4. commit the manifest at the checkpoint's location with the store's atomic write: until then
   readers see the previous checkpoint, after it the new one, whole;
5. remove the marker.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flyte_checkpoint.archive import walk_tree
from flyte_checkpoint.incremental.chunks import (
    ChunkStore,
    ReadChunks,
    parallel,
    put_object,
)
from flyte_checkpoint.incremental.condemned import read_condemned
from flyte_checkpoint.incremental.layout import PENDING, relative_store
from flyte_checkpoint.incremental.manifest import (
    MANIFEST_FORMAT,
    ChunkRef,
    DirectoryEntry,
    FileEntry,
    LinkEntry,
    Manifest,
)
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.storage import Backend, ObjectInfo
from flyte_checkpoint.storage.base import CommitTurn, WriteGate

logger = logging.getLogger("flyte_checkpoint")


@dataclass(frozen=True)
class IncrementalSave:
    """How an incremental save goes beyond its directory: the store and the save's hooks.

    ``gate`` is waited on before each chunk upload (a background save's pause);
    ``check_unchanged`` runs after the last chunk and before the manifest commits;
    ``commit_turn`` is held across the manifest's commit (as a single-object save holds it).
    """

    store: ChunkStore
    progress: ProgressCallback | None = None
    gate: WriteGate | None = None
    check_unchanged: Callable[[], None] | None = None
    commit_turn: CommitTurn | None = None


def save_directory(backend: Backend, uri: str, directory: Path, how: IncrementalSave) -> ObjectInfo:
    """Save ``directory`` as an incremental checkpoint whose manifest is the object at ``uri``.

    Returns the manifest's info; :attr:`ChunkStore.uploaded_bytes` counts the chunk bytes sent.
    """
    store = how.store
    read = ReadChunks(store.kept_for_upload)
    manifest, where = _manifest_of(directory, store, relative_store(uri, store.uri), read)
    marker = f"{store.uri}/{PENDING}/{uuid.uuid4().hex}.json"
    put_object(backend, marker, json.dumps(sorted(manifest.digests())).encode(), "payload")
    try:
        # After the marker and before the lookups: a chunk a collection condemned may be deleted
        # by the next one however it is found now, so it is uploaded again (see .gc).
        condemned = read_condemned(backend, store.uri).chunks.keys() & manifest.digests()
        missing = store.missing(backend, manifest.digests()) | condemned
        uploads: dict[str, tuple[str, int, ChunkRef]] = {}
        for entry in manifest.files:
            for index, ref in enumerate(entry.chunks):
                if ref.sha256 in missing and ref.sha256 not in uploads:
                    uploads[ref.sha256] = (where[entry.path], index, ref)
        total = sum(ref.size for _, _, ref in uploads.values())
        sent = [0]
        counting = threading.Lock()

        def upload(item: tuple[str, int, ChunkRef]) -> None:
            if how.gate is not None:
                how.gate.wait()
            path, index, ref = item
            store.upload(backend, path, index, ref, read)
            if how.progress is not None:
                with counting:
                    sent[0] += ref.size
                    how.progress(sent[0], total)

        parallel(upload, uploads.values(), store.workers)
        if how.progress is not None and not uploads:
            how.progress(0, 0)  # nothing to send: done
        if how.check_unchanged is not None:
            how.check_unchanged()
        info = put_object(backend, uri, manifest.encode(), MANIFEST_FORMAT, turn=how.commit_turn)
    finally:
        _remove_marker(backend, marker)
    logger.debug("%s: uploaded %d new chunk bytes of %d", uri, total, manifest.content_size)
    return info


def _manifest_of(
    directory: Path, store: ChunkStore, relative: str, read: ReadChunks
) -> tuple[Manifest, dict[str, str]]:
    """The manifest of ``directory`` and where each listed file is on disk (hashing in parallel)."""
    directories, links, files = [], [], []
    for kind, path, name, status, target in walk_tree(directory):
        if kind == "directory":
            directories.append(DirectoryEntry(path=name, mode=status.st_mode & 0o7777))
        elif kind == "symlink":
            links.append(LinkEntry(path=name, target=target))
        else:
            files.append((path, name, status))
    chunks = parallel(lambda item: store.chunks_of(item[0], item[2], read), files, store.workers)
    store.forget_all_but(status for _, _, status in files)
    entries = [
        FileEntry(path=name, mode=status.st_mode & 0o7777, size=status.st_size, chunks=refs)
        for (_, name, status), refs in zip(files, chunks, strict=True)
    ]
    manifest = Manifest(
        chunk_store=relative,
        chunk_size=store.chunk_size,
        directories=tuple(directories),
        files=tuple(entries),
        symlinks=tuple(links),
    )
    return manifest, {name: path for path, name, _ in files}


def _remove_marker(backend: Backend, marker: str) -> None:
    """Remove this save's marker; a failure is only logged: it must not hide the save's own
    outcome, and garbage collection removes a marker left behind once it expires."""
    try:
        backend.delete(marker)
    except Exception as error:
        logger.warning("could not remove the pending-save marker %s: %s", marker, error)
