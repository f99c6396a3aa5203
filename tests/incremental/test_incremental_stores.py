"""Incremental saves end to end on every store, through the public helper: growth uploads only
the new chunks, garbage collection keeps what the destination and the resume source need and
removes orphans, a missing chunk is refused, and a retried attempt resumes from an incremental
save."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, current_checkpoint, run_with_retries
from flyte_checkpoint.errors import CheckpointChunkError
from flyte_checkpoint.incremental import ChunkStore
from flyte_checkpoint.incremental.chunks import ReadChunks
from flyte_checkpoint.incremental.manifest import ChunkRef
from flyte_checkpoint.integrations._mirror import DirectoryMirror
from flyte_checkpoint.storage import Backend, backend_for
from tests.conftest import tree_of
from tests.stores import Store

KIB = 1024


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every chunk any helper uploads, in order."""
    sizes: list[int] = []
    upload = ChunkStore.upload

    def counted(
        self: ChunkStore,
        backend: Backend,
        path: str,
        index: int,
        ref: ChunkRef,
        read: ReadChunks | None = None,
    ) -> None:
        upload(self, backend, path, index, ref, read)
        sizes.append(ref.size)

    monkeypatch.setattr(ChunkStore, "upload", counted)
    return sizes


def helper(store: Store, dest: str, src: str | None = None) -> Checkpoint:
    return Checkpoint(store.uri(dest), store.uri(src) if src else None, storage_options=store.storage_options)


def chunk_uris(store: Store, chunks: str) -> list[str]:
    backend = backend_for(store.uri(chunks), store.storage_options)
    return sorted(backend.list_prefix(f"{store.uri(chunks)}/sha256"))


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_each_save_of_a_growing_directory_uploads_only_what_is_new(
    any_store: Store, tmp_path: Path, uploads: list[int], background: bool
) -> None:
    source = tmp_path / "output"
    (source / "logs").mkdir(parents=True)
    (source / "logs" / "train.log").write_text("step 0\n")
    with helper(any_store, "ckpt") as saving:
        for step in range(3):
            before = len(uploads)
            (source / f"checkpoint-{step}.bin").write_bytes(os.urandom((step + 1) * 10 * KIB))
            saving.save_sync(source, incremental=True, background=background)
            saving.wait_sync()
            expected = [(step + 1) * 10 * KIB] + ([len("step 0\n")] if step == 0 else [])
            assert sorted(uploads[before:]) == sorted(expected)
    assert len(chunk_uris(any_store, "ckpt.chunks")) == 4
    with helper(any_store, "next", "ckpt") as loading:
        restored = loading.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(source)


async def test_the_async_helper_saves_and_loads_incrementally(any_store: Store, tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(40 * KIB))
    (source / "empty").write_bytes(b"")
    async with helper(any_store, "ckpt") as saving:
        await saving.save(source, incremental=True)
    async with helper(any_store, "next", "ckpt") as loading:
        restored = await loading.load()
        assert restored is not None
        assert tree_of(restored) == tree_of(source)


def test_garbage_collection_removes_orphans_and_keeps_what_the_destination_needs(
    any_store: Store, tmp_path: Path
) -> None:
    source = tmp_path / "state"
    source.mkdir()
    shared, dropped, added = os.urandom(3 * KIB), os.urandom(2 * KIB), os.urandom(1 * KIB)
    with helper(any_store, "ckpt") as saving:
        (source / "shared").write_bytes(shared)
        (source / "old").write_bytes(dropped)
        saving.save_sync(source, incremental=True)
        (source / "old").unlink()
        (source / "new").write_bytes(added)
        saving.save_sync(source, incremental=True)
        assert saving.collect_garbage_sync().removed == 0  # the orphan is within the grace period
        collected = saving.collect_garbage_sync(grace=datetime.timedelta(0))
    assert (collected.removed, collected.removed_bytes, collected.kept) == (1, len(dropped), 2)
    assert len(chunk_uris(any_store, "ckpt.chunks")) == 2
    with helper(any_store, "next", "ckpt") as loading:
        restored = loading.load_sync()
        assert restored is not None
        assert tree_of(restored) == {"shared": shared, "new": added}


@pytest.mark.parametrize(("damage", "message"), [("missing", "is missing"), ("altered", "does not match")])
def test_a_missing_or_altered_chunk_fails_the_load_and_leaves_the_workspace_empty(
    any_store: Store, tmp_path: Path, damage: str, message: str
) -> None:
    source = tmp_path / "state"
    source.mkdir()
    (source / "model.bin").write_bytes(os.urandom(5 * KIB))
    with helper(any_store, "ckpt") as saving:
        saving.save_sync(source, incremental=True)
    (chunk,) = chunk_uris(any_store, "ckpt.chunks")
    backend = backend_for(chunk, any_store.storage_options)
    if damage == "missing":
        backend.delete(chunk)
    else:  # a well-formed object (its own digest recorded) holding other bytes
        writer = backend.open_write(chunk, {})
        writer.write(os.urandom(5 * KIB))
        writer.commit()
    with helper(any_store, "next", "ckpt") as loading:
        with pytest.raises(CheckpointChunkError, match=rf"model\.bin.*{message}"):
            loading.load_sync()
        assert list(loading.path.iterdir()) == []


def test_a_retry_resumes_from_the_incremental_save_of_the_attempt_before(
    any_store: Store, tmp_path: Path, uploads: list[int]
) -> None:
    """Attempt 0 saves incrementally and fails; attempt 1 restores that save (staged as its
    previous checkpoint), uploads only what it adds, and its garbage collection keeps the chunks
    the resume source still references."""
    source = tmp_path / "work"
    kept, dropped, later = os.urandom(6 * KIB), os.urandom(3 * KIB), os.urandom(2 * KIB)
    resumed: list[dict[str, bytes | None]] = []

    def task() -> str:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        if restored is None:
            source.mkdir()
            (source / "kept.bin").write_bytes(kept)
            (source / "dropped.bin").write_bytes(dropped)
            checkpoint.save_sync(source, incremental=True)
            raise RuntimeError("the node went away")
        resumed.append(tree_of(restored))
        before = len(uploads)
        (source / "dropped.bin").unlink()
        (source / "later.bin").write_bytes(later)
        checkpoint.save_sync(source, incremental=True)
        assert uploads[before:] == [len(later)]
        assert checkpoint.collect_garbage_sync(grace=datetime.timedelta(0)).removed == 0
        return "done"

    result = run_with_retries(
        task, retries=1, checkpoint_dir=any_store.uri("run"), storage_options=any_store.storage_options
    )
    assert result == "done"
    assert resumed == [{"dropped.bin": dropped, "kept.bin": kept}]
    assert len(chunk_uris(any_store, "run/checkpoint.chunks")) == 3


def test_a_later_attempt_walks_back_to_an_earlier_attempts_incremental_save(
    any_store: Store, tmp_path: Path, uploads: list[int]
) -> None:
    """Per-attempt layout (``…/{run}/{action}/{n}/…``): attempt 0 saves, attempt 1 dies before
    saving, attempt 2 finds attempt 0's manifest by walking back, resolves the chunk store the
    attempts share, uploads only what it adds and keeps attempt 0's chunks at collection."""
    if any_store.kind == "azure":  # walk-back knows az:// and abfss://, not abfs:// (uris.REPAIRABLE_SCHEMES)
        any_store = dataclasses.replace(any_store, base=any_store.base.replace("abfs://", "az://", 1))
    source = tmp_path / "work"
    source.mkdir()
    first, added = os.urandom(4 * KIB), os.urandom(1 * KIB)
    (source / "first.bin").write_bytes(first)

    def attempt(number: int, src: str | None) -> Checkpoint:
        return Checkpoint(
            any_store.uri(f"r1/a0/{number}/_flytecheckpoints"),
            any_store.uri(src) if src else None,
            storage_options=any_store.storage_options,
            run_name="r1",
            action_name="a0",
            attempt_number=number,
        )

    with attempt(0, None) as zero:
        zero.save_sync(source, incremental=True)
    before = len(uploads)
    with attempt(2, "r1/a0/1/_flytecheckpoints") as two:
        restored = two.load_sync()
        assert restored is not None
        assert tree_of(restored) == {"first.bin": first}
        restored_from = two.restored_from
        assert restored_from is not None
        assert restored_from.uri == any_store.uri("r1/a0/0/_flytecheckpoints")
        (source / "first.bin").unlink()
        (source / "added.bin").write_bytes(added)
        two.save_sync(source, incremental=True)
        assert uploads[before:] == [len(added)]
        assert two.collect_garbage_sync(grace=datetime.timedelta(0)).removed == 0
    assert len(chunk_uris(any_store, "r1/a0/.flyte-checkpoint-chunks/_flytecheckpoints")) == 2


def test_the_mirror_callbacks_store_each_framework_checkpoint_once(any_store: Store, tmp_path: Path) -> None:
    """What the Hugging Face and Lightning mirror callbacks share: an output directory gaining a
    ``checkpoint-N`` per save costs the new one; a rotation leaves the object without the old one."""
    output = tmp_path / "output"
    output.mkdir()
    with helper(any_store, "ckpt") as saving:
        mirror = DirectoryMirror(incremental=True)
        for step in range(3):
            (output / f"checkpoint-{step}").mkdir()
            (output / f"checkpoint-{step}" / "model.bin").write_bytes(os.urandom(8 * KIB))
            mirror.save(saving, output)
        backend = backend_for(any_store.uri("ckpt"), any_store.storage_options)
        infos = [backend.info(uri) for uri in chunk_uris(any_store, "ckpt.chunks")]
        assert sum(info.size for info in infos if info is not None) == 3 * 8 * KIB
        shutil.rmtree(output / "checkpoint-0")  # the framework rotates the oldest out
        mirror.save(saving, output)
    with helper(any_store, "next", "ckpt") as loading:
        restored = loading.load_sync()
        assert restored is not None
        assert sorted(path.name for path in restored.iterdir()) == ["checkpoint-1", "checkpoint-2"]
