"""Indexed directory objects end to end on every store, through the public helper: saved as
independent members with an index, loaded byte-identical, read by ``tarfile`` and ``tar -xzf``
after download; damage refused with the workspace left empty; single-stream objects (what earlier
versions wrote) still load."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from flyte_checkpoint import ArchiveIndexError, Checkpoint, CheckpointCorruptError
from flyte_checkpoint.archive import members
from flyte_checkpoint.storage import backend_for
from tests.archive.test_indexed_archive import extracted_by_tar
from tests.conftest import tree_of
from tests.stores import Store

TEXT = "".join(f"step {i} loss {1 / (i + 1):.6f} lr 0.0003\n" for i in range(4000))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Random weights over two members (stored), text (deflated), nesting and an empty file."""
    root = tmp_path / "tree"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "model.bin").write_bytes(os.urandom(members.BLOCK + 54321))
    (root / "log.txt").write_text(TEXT)
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "nested" / "deeper" / "notes é.txt").write_text("résumé\n" * 50)
    (root / "empty").write_bytes(b"")
    return root


def read_object(store: Store, uri: str) -> bytes:
    reader = backend_for(uri, store.storage_options).open_read(uri)
    assert reader is not None
    with reader:
        return reader.readall()


def put_object(store: Store, uri: str, data: bytes) -> None:
    """Write ``data`` at ``uri`` as another tool would: no metadata of ours (no recorded digest)."""
    writer = backend_for(uri, store.storage_options).open_write(uri, {})
    writer.write(data)
    writer.commit()


def helper(store: Store, dest: str, src: str | None = None) -> Checkpoint:
    return Checkpoint(store.uri(dest), store.uri(src) if src else None, storage_options=store.storage_options)


def test_a_directory_saves_indexed_loads_identical_and_tar_reads_it(
    any_store: Store, tree: Path, tmp_path: Path
) -> None:
    with helper(any_store, "ckpt") as saving:
        saving.save_sync(tree)
    data = read_object(any_store, any_store.uri("ckpt"))
    assert members.is_indexed(data[: members.HEADER_PREFIX])
    _, count, _ = members.decode_tail(data[-members.TAIL_SIZE :])
    assert count >= 2
    assert len(data) < (tree / "weights" / "model.bin").stat().st_size + len(TEXT) // 2
    with helper(any_store, "next", "ckpt") as loading:
        restored = loading.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(tree)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as opened:
        assert "weights/model.bin" in opened.getnames()
    assert tree_of(extracted_by_tar(data, tmp_path)) == tree_of(tree)


async def test_the_async_helper_saves_and_loads_an_indexed_object(any_store: Store, tree: Path) -> None:
    async with helper(any_store, "ckpt") as saving:
        await saving.save(tree)
    async with helper(any_store, "next", "ckpt") as loading:
        restored = await loading.load()
        assert restored is not None
        assert tree_of(restored) == tree_of(tree)


def _damaged(data: bytes, damage: str) -> bytes:
    index_offset, _, _ = members.decode_tail(data[-members.TAIL_SIZE :])
    if damage == "truncated":  # every data member whole: only the missing index tells
        return data[:index_offset]
    first_entry = index_offset + members.HEADER_PREFIX + 4 + 4  # its uncompressed length
    return data[:first_entry] + (7).to_bytes(4, "little") + data[first_entry + 4 :]


@pytest.mark.parametrize(
    ("damage", "message"),
    [("truncated", "before the end of its index"), ("tampered-index", "lists data member 0 as")],
)
def test_a_truncated_or_tampered_object_is_refused_and_the_workspace_left_empty(
    any_store: Store, tree: Path, damage: str, message: str
) -> None:
    with helper(any_store, "ckpt") as saving:
        saving.save_sync(tree)
    data = read_object(any_store, any_store.uri("ckpt"))
    put_object(any_store, any_store.uri("damaged"), _damaged(data, damage))
    with helper(any_store, "next", "damaged") as loading:
        with pytest.raises(CheckpointCorruptError, match=message) as raised:
            loading.load_sync()
        if damage == "tampered-index":
            assert isinstance(raised.value, ArchiveIndexError)
        assert list(loading.path.iterdir()) == []


@pytest.mark.parametrize("writer", ["tarfile", "gzip-cli"])
def test_a_single_stream_object_of_the_previous_format_still_loads(
    any_store: Store, tree: Path, tmp_path: Path, writer: str
) -> None:
    """Earlier versions (and ``tar -czf``) wrote one gzip stream without members or an index."""
    if writer == "tarfile":
        sink = io.BytesIO()
        with tarfile.open(fileobj=sink, mode="w:gz", format=tarfile.PAX_FORMAT) as packing:
            for path in sorted(tree.rglob("*")):
                packing.add(path, arcname=path.relative_to(tree).as_posix(), recursive=False)
        data = sink.getvalue()
    else:
        made = tmp_path / "made.tar.gz"
        subprocess.run(["tar", "-czf", str(made), "-C", str(tree), "."], check=True)
        data = made.read_bytes()
    assert not members.is_indexed(data[: members.HEADER_PREFIX])
    put_object(any_store, any_store.uri("old"), data)
    with helper(any_store, "next", "old") as loading:
        restored = loading.load_sync()
        assert restored is not None
        assert tree_of(restored) == tree_of(tree)
