"""The two-phase garbage collection: a save that reuses an unreferenced chunk while a
collection is under way keeps it; a chunk is deleted only by a second collection, after the
grace period, if nothing referenced or uploaded it again since the first condemned it."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest

from flyte_checkpoint.incremental import ChunkStore, IncrementalSave, chunk_store_for, collect_garbage, gc
from flyte_checkpoint.incremental.condemned import read_condemned
from flyte_checkpoint.incremental.save import save_directory
from flyte_checkpoint.single.transfer import load_object
from flyte_checkpoint.storage import Backend, backend_for
from tests.conftest import tree_of
from tests.stores import Store

OLD, KEPT = b"reused later" * 400, b"always kept" * 300
LATER = datetime.timedelta(hours=2)  # beyond the default grace period


class _Saver:
    """Saves whole trees to one checkpoint of ``store`` through one chunk store."""

    def __init__(self, store: Store, tmp_path: Path) -> None:
        self.uri = store.uri("ckpt")
        self.backend: Backend = backend_for(self.uri, store.storage_options)
        self.chunks = ChunkStore(chunk_store_for(self.uri, run_name=None, action_name=None))
        self.source = tmp_path / "source"
        self.source.mkdir()
        self.tmp_path = tmp_path

    def save(self, files: dict[str, bytes]) -> None:
        for existing in self.source.iterdir():
            existing.unlink()
        for name, data in files.items():
            (self.source / name).write_bytes(data)
        save_directory(self.backend, self.uri, self.source, IncrementalSave(self.chunks))

    def collect(self, now: datetime.datetime | None = None) -> gc.CollectedGarbage:
        return collect_garbage(self.backend, self.chunks, [self.uri], now=now)

    def loaded(self) -> dict[str, bytes | None]:
        workspace = self.tmp_path / "restored"
        workspace.mkdir(exist_ok=True)
        for path in workspace.iterdir():
            path.unlink()
        restored = load_object(self.backend, self.uri, workspace, reset=lambda: None)
        assert restored is not None
        return tree_of(restored)


@pytest.fixture
def saver(any_store: Store, tmp_path: Path) -> _Saver:
    return _Saver(any_store, tmp_path)


def _in(delta: datetime.timedelta) -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc) + delta


def test_a_save_reusing_an_unreferenced_chunk_during_a_collection_keeps_it(
    saver: _Saver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside tester's interleaving: the collection reads markers and manifests, another
    process then saves reusing the unreferenced chunk and commits, the collection deletes."""
    saver.save({"old": OLD, "kept": KEPT})
    saver.save({"kept": KEPT})  # "old"'s chunk is now unreferenced
    assert saver.collect().removed == 0  # within the grace period (and condemned by it)
    time.sleep(1.1)  # stores keeping whole seconds must see the new upload's time differ
    read_manifest = gc._referenced_by

    def read_then_save_elsewhere(backend: Backend, uri: str) -> set[str]:
        referenced = read_manifest(backend, uri)
        saver.save({"old": OLD, "kept": KEPT})  # the chunk is still stored: reused
        return referenced

    monkeypatch.setattr(gc, "_referenced_by", read_then_save_elsewhere)
    saver.collect(now=_in(LATER))
    monkeypatch.undo()
    assert saver.loaded() == {"old": OLD, "kept": KEPT}


def test_a_chunk_unreferenced_in_two_collections_a_grace_period_apart_is_deleted(saver: _Saver) -> None:
    saver.save({"old": OLD, "kept": KEPT})
    saver.save({"kept": KEPT})
    first = saver.collect(now=_in(LATER))  # nothing condemned yet: only condemns
    assert (first.removed, first.kept) == (0, 2)
    assert len(read_condemned(saver.backend, saver.chunks.uri).chunks) == 1
    assert saver.collect().removed == 0  # the record is younger than the grace period
    second = saver.collect(now=_in(LATER))
    assert (second.removed, second.removed_bytes, second.kept) == (1, len(OLD), 1)
    assert read_condemned(saver.backend, saver.chunks.uri).chunks == {}
    assert saver.loaded() == {"kept": KEPT}


def test_a_condemned_chunk_referenced_again_is_kept(saver: _Saver) -> None:
    saver.save({"old": OLD, "kept": KEPT})
    saver.save({"kept": KEPT})
    saver.collect()  # condemns "old"'s chunk
    before = saver.chunks.uploaded_bytes
    saver.save({"old": OLD, "kept": KEPT})  # references it again: uploaded again, being condemned
    assert saver.chunks.uploaded_bytes - before == len(OLD)
    second = saver.collect(now=_in(LATER))
    assert (second.removed, second.kept) == (0, 2)
    assert saver.loaded() == {"old": OLD, "kept": KEPT}
