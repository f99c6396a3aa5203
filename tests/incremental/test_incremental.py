"""Incremental directory saves: only new content is uploaded, loads restore bytes and modes and
check every chunk, garbage collection keeps what live checkpoints need."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import (
    ArchiveLimitError,
    CheckpointChunkError,
    InputChangedError,
    UnsafeArchiveError,
)
from flyte_checkpoint.incremental import (
    ChunkStore,
    IncrementalSave,
    Manifest,
    chunk_store_for,
    collect_garbage,
    parse_manifest,
    save_directory,
)
from flyte_checkpoint.incremental.layout import PENDING
from flyte_checkpoint.incremental.manifest import DirectoryEntry, LinkEntry
from flyte_checkpoint.single.transfer import load_object
from flyte_checkpoint.storage import Backend, backend_for
from tests.conftest import tree_of
from tests.stores import Store

KIB = 1024


def _modes(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root)): path.lstat().st_mode & 0o7777
        for path in sorted(root.rglob("*"))
        if not path.is_symlink()
    }


def _stored_chunk_bytes(store: Store, chunks: ChunkStore) -> int:
    backend = backend_for(chunks.uri, store.storage_options)
    infos = [backend.info(uri) for uri in backend.list_prefix(f"{chunks.uri}/sha256")]
    return sum(info.size for info in infos if info is not None)


def _load(store: Store, uri: str, workspace: Path) -> Path | None:
    backend = backend_for(uri, store.storage_options)
    workspace.mkdir(exist_ok=True)

    def reset() -> None:
        for path in sorted(workspace.rglob("*"), key=lambda p: -len(p.parts)):
            path.unlink() if path.is_symlink() or not path.is_dir() else path.rmdir()

    return load_object(backend, uri, workspace, reset=reset)


@pytest.mark.parametrize("kept", [64 * KIB, 0], ids=["kept-in-memory", "read-again"])
def test_ten_saves_of_a_growing_directory_upload_only_the_new_files(
    store: Store, tmp_path: Path, kept: int
) -> None:
    source = tmp_path / "output"
    source.mkdir()
    uri = store.uri("run/ckpt")
    backend = backend_for(uri, store.storage_options)
    store_uri = chunk_store_for(uri, run_name=None, action_name=None)
    chunks = ChunkStore(store_uri, chunk_size=32 * KIB, kept_for_upload=kept)
    for step in range(10):
        size = (step + 1) * 10 * KIB
        (source / f"checkpoint-{step}.bin").write_bytes(os.urandom(size))
        before = chunks.uploaded_bytes
        save_directory(backend, uri, source, IncrementalSave(chunks))
        assert chunks.uploaded_bytes - before == size
    final_size = sum(path.stat().st_size for path in source.iterdir())
    assert _stored_chunk_bytes(store, chunks) == final_size
    restored = _load(store, uri, tmp_path / "restored")
    assert restored is not None
    assert tree_of(restored) == tree_of(source)


def test_a_new_helper_uploads_only_what_no_earlier_save_stored(store: Store, tmp_path: Path) -> None:
    """Chunks are found in the store, not remembered by one process: a retried attempt's helper
    (another object, the run's layout) uploads only what changed since the last attempt's save."""
    source = tmp_path / "output"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(300 * KIB))
    first = store.uri("r1/a0/0/_flytecheckpoints")
    with Checkpoint(first, storage_options=store.storage_options, run_name="r1", action_name="a0") as helper:
        helper.save_sync(source, incremental=True)
    shared = chunk_store_for(first, run_name="r1", action_name="a0")
    assert shared == store.uri("r1/a0/.flyte-checkpoint-chunks/_flytecheckpoints")
    (source / "extra.bin").write_bytes(os.urandom(7 * KIB))
    second = store.uri("r1/a0/1/_flytecheckpoints")
    backend = backend_for(second, store.storage_options)
    chunks = ChunkStore(shared)
    save_directory(backend, second, source, IncrementalSave(chunks))
    assert chunks.uploaded_bytes == 7 * KIB


def test_load_restores_bytes_modes_links_and_empty_entries(any_store: Store, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    (source / "nested" / "deeper").mkdir(parents=True)
    (source / "empty-dir").mkdir()
    (source / "big.bin").write_bytes(os.urandom(70 * KIB))  # five chunks of 16 KiB, the last short
    (source / "nested" / "run.sh").write_bytes(b"#!/bin/sh\necho hi\n")
    (source / "nested" / "deeper" / "secret").write_bytes(b"s")
    (source / "empty").write_bytes(b"")
    (source / "same-as-secret").write_bytes(b"s")
    os.chmod(source / "nested" / "run.sh", 0o755)
    os.chmod(source / "nested" / "deeper" / "secret", 0o600)
    os.chmod(source / "empty-dir", 0o750)
    os.symlink("nested/run.sh", source / "link")
    uri = any_store.uri("ckpt")
    backend = backend_for(uri, any_store.storage_options)
    chunks = ChunkStore(chunk_store_for(uri, run_name=None, action_name=None), chunk_size=16 * KIB)
    save_directory(backend, uri, source, IncrementalSave(chunks))
    restored = _load(any_store, uri, tmp_path / "restored")
    assert restored is not None
    assert tree_of(restored) == tree_of(source)
    assert _modes(restored) == _modes(source)
    assert os.readlink(restored / "link") == "nested/run.sh"


def _one_file(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    """A directory holding one file, and where to save it."""
    source = tmp_path / "state"
    source.mkdir()
    (source / "a.bin").write_bytes(data)
    return source, tmp_path / "store" / "ckpt"


def test_the_helper_saves_incrementally_and_loads_either_kind(tmp_path: Path) -> None:
    source, dest = _one_file(tmp_path, b"first")
    with Checkpoint(dest) as helper:
        helper.save_sync(source, incremental=True, background=True)
        helper.wait_sync()
    assert dest.read_bytes().startswith(b'{"format":"flyte-checkpoint-incremental"')
    with Checkpoint(tmp_path / "next", checkpoint_src=dest) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(source)
    with Checkpoint(dest) as helper:
        helper.save_sync(source)  # a plain save replaces the manifest with an archive
    with Checkpoint(tmp_path / "next", checkpoint_src=dest) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(source)


def test_a_manifest_without_its_metadata_is_still_recognised(tmp_path: Path) -> None:
    source, dest = _one_file(tmp_path, b"content")
    with Checkpoint(dest) as helper:
        helper.save_sync(source, incremental=True)
    copied = dest.with_name("copied")  # beside it, so its relative chunk store is the same
    copied.write_bytes(dest.read_bytes())  # a plain write: no recorded format
    restored = _load(Store("local", str(tmp_path)), str(copied), tmp_path / "restored")
    assert restored is not None
    assert tree_of(restored) == tree_of(source)


def _saved(
    store: Store, tmp_path: Path, files: dict[str, bytes], name: str = "ckpt"
) -> tuple[str, ChunkStore]:
    source = tmp_path / f"src-{name}"
    source.mkdir(exist_ok=True)
    for existing in source.iterdir():
        existing.unlink()
    for file_name, data in files.items():
        (source / file_name).write_bytes(data)
    uri = store.uri(name)
    chunks = ChunkStore(chunk_store_for(uri, run_name=None, action_name=None))
    save_directory(backend_for(uri, store.storage_options), uri, source, IncrementalSave(chunks))
    return uri, chunks


@pytest.mark.parametrize("damage", ["altered", "missing"])
def test_a_damaged_or_missing_chunk_fails_the_load_naming_the_file(
    store: Store, tmp_path: Path, damage: str
) -> None:
    uri, chunks = _saved(store, tmp_path, {"model.bin": b"weights" * 1000, "other": b"x"})
    backend = backend_for(uri, store.storage_options)
    manifest = parse_manifest(_read(store, uri), uri)
    (entry,) = [entry for entry in manifest.files if entry.path == "model.bin"]
    chunk = chunks.chunk_uri(entry.chunks[0].sha256)
    if damage == "altered":
        writer = backend.open_write(chunk, {})  # a well-formed object holding other bytes
        writer.write(b"weights" * 999 + b"WEIGHT")
        writer.commit()
    else:
        backend.delete(chunk)
    workspace = tmp_path / "restored"
    with pytest.raises(CheckpointChunkError, match=r"model\.bin") as raised:
        _load(store, uri, workspace)
    assert ("does not match" if damage == "altered" else "is missing") in str(raised.value)
    assert list(workspace.iterdir()) == []  # nothing half-restored is left


def _read(store: Store, uri: str) -> bytes:
    reader = backend_for(uri, store.storage_options).open_read(uri)
    assert reader is not None
    with reader:
        return reader.readall()


def test_an_unsafe_manifest_is_refused(tmp_path: Path) -> None:
    dest = tmp_path / "store" / "ckpt"
    dest.parent.mkdir()
    for hostile in (
        Manifest(
            chunk_store="ckpt.chunks", chunk_size=1, directories=(DirectoryEntry(path="../up", mode=0o755),)
        ),
        Manifest(chunk_store="ckpt.chunks", chunk_size=1, symlinks=(LinkEntry(path="out", target="/etc"),)),
        Manifest(chunk_store="ckpt.chunks", chunk_size=1, symlinks=(LinkEntry(path="a", target="b/../.."),)),
    ):
        dest.write_bytes(hostile.encode())
        with pytest.raises(UnsafeArchiveError):
            _load(Store("local", str(tmp_path)), str(dest), tmp_path / "restored")
        assert not (tmp_path / "up").exists()


def test_a_newer_manifest_version_asks_to_upgrade(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    document = json.loads(Manifest(chunk_store="x", chunk_size=1).encode())
    dest.write_bytes(json.dumps({**document, "version": 2}, separators=(",", ":")).encode())
    with pytest.raises(ValueError, match="upgrade flyte_checkpoint"):
        _load(Store("local", str(tmp_path)), str(dest), tmp_path / "restored")


def test_garbage_collection_keeps_live_chunks_and_removes_orphans(any_store: Store, tmp_path: Path) -> None:
    shared, dropped, added = b"kept" * 500, b"dropped" * 300, b"added" * 200
    uri, chunks = _saved(any_store, tmp_path, {"shared": shared, "old": dropped})
    _saved(any_store, tmp_path, {"shared": shared, "new": added})  # replaces the manifest at uri
    backend = backend_for(uri, any_store.storage_options)
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    young = collect_garbage(backend, chunks, [uri])  # the orphan is younger than the grace period
    assert young.removed == 0
    collected = collect_garbage(backend, chunks, [uri], now=later)
    assert (collected.removed, collected.removed_bytes, collected.kept) == (1, len(dropped), 2)
    restored = _load(any_store, uri, tmp_path / "restored")
    assert restored is not None
    assert tree_of(restored) == {"shared": shared, "new": added}


def test_garbage_collection_refuses_a_manifest_over_the_size_limit_and_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store("local", str(tmp_path / "store"))
    uri, chunks = _saved(store, tmp_path, {"kept": b"kept" * 500})
    backend = backend_for(uri, store.storage_options)
    monkeypatch.setenv("FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES", "100")
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    with pytest.raises(ArchiveLimitError, match="FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES"):
        collect_garbage(backend, chunks, [uri], now=later)
    monkeypatch.delenv("FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES")
    restored = _load(store, uri, tmp_path / "restored")
    assert restored is not None
    assert tree_of(restored) == {"kept": b"kept" * 500}


def test_garbage_collection_keeps_the_chunks_of_a_save_in_progress(any_store: Store, tmp_path: Path) -> None:
    """A save lists its chunks in a pending marker before it uploads any; until its manifest
    commits, only that marker says they are needed."""
    uri, chunks = _saved(any_store, tmp_path, {"pending": b"in flight" * 100})
    backend = backend_for(uri, any_store.storage_options)
    manifest = parse_manifest(_read(any_store, uri), uri)
    marker = f"{chunks.uri}/{PENDING}/other-save.json"
    writer = backend.open_write(marker, {})
    writer.write(json.dumps(sorted(manifest.digests())).encode())
    writer.commit()
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    # No live manifest references the chunk (as if the saving process had not committed yet).
    assert collect_garbage(backend, chunks, [], now=later).removed == 0
    much_later = later + datetime.timedelta(days=2)  # the marker of a save killed long ago expires
    assert collect_garbage(backend, chunks, [], now=much_later).removed == 0  # condemned only
    assert collect_garbage(backend, chunks, [], now=much_later).removed == 1
    assert backend.info(marker) is None


def test_the_helper_collects_garbage_of_replaced_saves(tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.mkdir()
    dest = tmp_path / "store" / "r1" / "a0" / "0" / "ckpt"
    with Checkpoint(dest, run_name="r1", action_name="a0") as helper:
        (source / "one").write_bytes(b"1" * 1000)
        helper.save_sync(source, incremental=True)
        (source / "one").unlink()
        (source / "two").write_bytes(b"2" * 1000)
        helper.save_sync(source, incremental=True)
        helper.collect_garbage_sync(grace=datetime.timedelta(0))  # condemns the orphan
        collected = helper.collect_garbage_sync(grace=datetime.timedelta(0))
    assert (collected.removed, collected.kept) == (1, 1)


def test_a_file_rewritten_during_the_save_fails_it_and_commits_nothing(tmp_path: Path) -> None:
    source, dest = _one_file(tmp_path, b"a" * 1000)
    uri = str(dest)
    chunks = ChunkStore(chunk_store_for(uri, run_name=None, action_name=None), kept_for_upload=0)
    looked_up = chunks.missing

    def rewrite_then_look_up(backend: Backend, digests: Iterable[str]) -> set[str]:
        (source / "a.bin").write_bytes(b"b" * 1000)  # after hashing, before the upload reads it
        return looked_up(backend, digests)

    chunks.missing = rewrite_then_look_up  # type: ignore[method-assign]
    with pytest.raises(InputChangedError, match="modified while it was being saved"):
        save_directory(backend_for(uri), uri, source, IncrementalSave(chunks))
    assert not dest.exists()
    assert list((Path(chunks.uri) / PENDING).iterdir()) == []  # its marker is gone too
