"""Incremental directory checkpoints: save only what changed (opt-in).

A directory saved with ``save(path, incremental=True)`` is stored as content-addressed chunks
in a chunk store shared by every save and attempt of the checkpoint (:mod:`.layout`), and a
manifest (:mod:`.manifest`) at the checkpoint's own location, committed last with the store's
atomic write: the manifest is what makes the save visible. A save uploads only the chunks the
store lacks (:mod:`.save`); a load fetches and checks every chunk in parallel (:mod:`.load`);
:mod:`.gc` removes chunks no live checkpoint references. Storage only: this package knows no
helper, scheduler or task context.
"""

from __future__ import annotations

from flyte_checkpoint.incremental.chunks import DEFAULT_WORKERS, ChunkStore
from flyte_checkpoint.incremental.gc import DEFAULT_GRACE, CollectedGarbage, collect_garbage
from flyte_checkpoint.incremental.layout import chunk_store_for
from flyte_checkpoint.incremental.load import restore_directory
from flyte_checkpoint.incremental.manifest import MANIFEST_FORMAT, Manifest, is_manifest_head, parse_manifest
from flyte_checkpoint.incremental.save import IncrementalSave, save_directory

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_WORKERS",
    "MANIFEST_FORMAT",
    "ChunkStore",
    "CollectedGarbage",
    "IncrementalSave",
    "Manifest",
    "chunk_store_for",
    "collect_garbage",
    "is_manifest_head",
    "parse_manifest",
    "restore_directory",
    "save_directory",
]
