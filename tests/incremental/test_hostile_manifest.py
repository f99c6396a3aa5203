"""Hostile manifests, loaded as a user would: refused, or restored and cleaned up, without
leaving anything behind that breaks the next load."""

from __future__ import annotations

import datetime
import hashlib
import tempfile
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, ExtractionLimits
from flyte_checkpoint.errors import ArchiveLimitError, CheckpointChunkError, CheckpointCorruptError
from flyte_checkpoint.incremental.manifest import ChunkRef, DirectoryEntry, FileEntry, Manifest
from flyte_checkpoint.single.workspace import WORKSPACE_PREFIX
from flyte_checkpoint.tree_removal import remove_tree
from tests.conftest import tree_of

DEEPER_THAN_THE_RECURSION_LIMIT = 1200


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The temporary directory workspaces (and their sweep) use, emptied even after a failure: a
    deep tree left behind would break pytest's own clean-up of old runs, which recurses too."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    for child in tmp_path.iterdir():
        if child.is_dir() and not child.is_symlink():
            remove_tree(str(child))


def _deep_manifest(dest: Path) -> None:
    nested = tuple(
        DirectoryEntry(path="/".join(["d"] * depth), mode=0o755)
        for depth in range(1, DEEPER_THAN_THE_RECURSION_LIMIT)
    )
    dest.write_bytes(Manifest(chunk_store="ckpt.chunks", chunk_size=1, directories=nested).encode())


def test_a_tree_nested_past_the_recursion_limit_is_restored_and_its_workspace_removed(
    temp_dir: Path,
) -> None:
    dest = temp_dir / "ckpt"
    _deep_manifest(dest)
    with Checkpoint(temp_dir / "next", checkpoint_src=dest) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert (restored / "/".join(["d"] * (DEEPER_THAN_THE_RECURSION_LIMIT - 1))).is_dir()
    assert not list(temp_dir.glob(f"{WORKSPACE_PREFIX}*"))


def test_a_failed_load_of_a_tree_nested_past_the_recursion_limit_leaves_the_workspace_empty(
    temp_dir: Path,
) -> None:
    dest = temp_dir / "ckpt"
    _deep_manifest(dest)
    deep = Manifest.model_validate_json(dest.read_bytes())
    missing = FileEntry(path="d/lost", mode=0o644, size=1, chunks=(ChunkRef(sha256="0" * 64, size=1),))
    dest.write_bytes(deep.model_copy(update={"files": (missing,)}).encode())
    with Checkpoint(temp_dir / "next", checkpoint_src=dest) as helper:
        with pytest.raises(CheckpointChunkError, match="'d/lost'"):
            helper.load_sync()
        # The directory, not the lock file beside it: a glob on the name's last letter would miss
        # the one random name in 37 that ends in that letter.
        (workspace,) = (path for path in temp_dir.glob(f"{WORKSPACE_PREFIX}*") if path.is_dir())
        assert list(workspace.iterdir()) == []


def test_a_file_named_like_another_files_temporary_name_is_restored(tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.mkdir()
    (source / "f").write_bytes(b"the file")
    (source / ".f.fc-partial").write_bytes(b"a file of the task's own")
    with Checkpoint(tmp_path / "ckpt") as helper:
        helper.save_sync(source, incremental=True)
    with Checkpoint(tmp_path / "next", checkpoint_src=tmp_path / "ckpt") as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(source)


def test_a_sparse_file_is_restored_sparse_without_fetching_its_zeros(tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.mkdir()
    with open(source / "preallocated", "wb") as sparse:
        sparse.write(b"head")
        sparse.truncate(48 << 20)  # three 16 MiB chunks, the last two all zeros
    dest = tmp_path / "ckpt"
    with Checkpoint(dest) as helper:
        helper.save_sync(source, incremental=True)
    zeros = hashlib.sha256(bytes(16 << 20)).hexdigest()
    (tmp_path / "ckpt.chunks" / "sha256" / zeros[:2] / zeros).unlink()  # a load must not need it
    with Checkpoint(tmp_path / "next", checkpoint_src=dest) as helper:
        restored = helper.load_sync()
        assert restored is not None
        restored_file = restored / "preallocated"
        assert restored_file.stat().st_size == 48 << 20
        assert restored_file.stat().st_blocks * 512 < 20 << 20
        with open(restored_file, "rb") as data:
            assert data.read(4) == b"head"


@pytest.mark.parametrize("marker", [b"null", b"5", b"{not json"])
def test_a_damaged_pending_marker_stops_garbage_collection_naming_it(tmp_path: Path, marker: bytes) -> None:
    source = tmp_path / "state"
    source.mkdir()
    (source / "a").write_bytes(b"a" * 100)
    with Checkpoint(tmp_path / "ckpt") as helper:
        helper.save_sync(source, incremental=True)
        pending = tmp_path / "ckpt.chunks" / "pending"
        pending.mkdir(exist_ok=True)
        (pending / "damaged.json").write_bytes(marker)
        with pytest.raises(CheckpointCorruptError, match=r"marker .*damaged\.json is damaged"):
            helper.collect_garbage_sync(grace=datetime.timedelta(0))


def test_a_chunk_grown_past_its_listed_size_is_refused_without_reading_it(tmp_path: Path) -> None:
    source = tmp_path / "state"
    source.mkdir()
    (source / "small").write_bytes(b"s" * 100)
    dest = tmp_path / "ckpt"
    with Checkpoint(dest) as helper:
        helper.save_sync(source, incremental=True)
    digest = hashlib.sha256(b"s" * 100).hexdigest()
    with open(tmp_path / "ckpt.chunks" / "sha256" / digest[:2] / digest, "ab") as chunk:
        chunk.truncate(64 << 20)
    with Checkpoint(tmp_path / "next", checkpoint_src=dest) as helper:
        tracemalloc.start()
        try:
            with pytest.raises(CheckpointChunkError, match="'small' is damaged"):
                helper.load_sync()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 << 20


def _manifest_of_many_directories(dest: Path, count: int) -> int:
    listed = tuple(DirectoryEntry(path=f"d{number:07d}", mode=0o755) for number in range(count))
    encoded = Manifest(chunk_store="ckpt.chunks", chunk_size=1, directories=listed).encode()
    dest.write_bytes(encoded)
    return len(encoded)


def test_a_manifest_over_the_size_limit_is_refused_naming_the_setting_to_raise(temp_dir: Path) -> None:
    dest = temp_dir / "ckpt"
    size = _manifest_of_many_directories(dest, 40_000)  # about 1.4 MiB
    limits = ExtractionLimits(max_manifest_bytes=size - 1)
    helper = Checkpoint(temp_dir / "next", checkpoint_src=dest, extraction_limits=limits)
    setting = r"ExtractionLimits\(max_manifest_bytes=\.\.\.\).*FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES"
    with helper, pytest.raises(ArchiveLimitError, match=setting):
        helper.load_sync()
    assert not [path for path in temp_dir.glob(f"{WORKSPACE_PREFIX}*") if path.is_dir()]


def test_a_manifest_within_the_size_limit_loads(temp_dir: Path) -> None:
    dest = temp_dir / "ckpt"
    size = _manifest_of_many_directories(dest, 2_000)
    limits = ExtractionLimits(max_manifest_bytes=size)
    with Checkpoint(temp_dir / "next", checkpoint_src=dest, extraction_limits=limits) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert len(list(restored.iterdir())) == 2_000
