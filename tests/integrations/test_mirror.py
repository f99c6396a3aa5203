"""The mirror callbacks' shared saving: incremental by default, garbage collected on rotation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.incremental import CollectedGarbage
from flyte_checkpoint.integrations._mirror import DirectoryMirror

KIB = 1024


class Counting(Checkpoint):
    """Counts garbage collections."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collections = 0

    def collect_garbage_sync(self, **kwargs: Any) -> CollectedGarbage:
        self.collections += 1
        return super().collect_garbage_sync(**kwargs)


def _chunk_bytes(dest: Path) -> int:
    store = dest.with_name(dest.name + ".chunks") / "sha256"
    return sum(path.stat().st_size for path in store.rglob("*") if path.is_file())


def test_a_growing_output_directory_stores_each_checkpoint_once(tmp_path: Path) -> None:
    output = tmp_path / "output"
    output.mkdir()
    dest = tmp_path / "store" / "ckpt"
    mirror = DirectoryMirror(incremental=True)
    checkpoint = Counting(dest)
    with checkpoint:
        for step in range(5):
            (output / f"checkpoint-{step}").mkdir()
            (output / f"checkpoint-{step}" / "model.bin").write_bytes(os.urandom(64 * KIB))
            mirror.save(checkpoint, output)
        assert checkpoint.collections == 0
        final = sum(path.stat().st_size for path in output.rglob("*") if path.is_file())
        assert _chunk_bytes(dest) == final  # 5 saves, each checkpoint stored once
        (output / "checkpoint-0" / "model.bin").unlink()  # the framework rotates one out
        (output / "checkpoint-0").rmdir()
        mirror.save(checkpoint, output)
        assert checkpoint.collections == 1
    with Checkpoint(tmp_path / "next", checkpoint_src=dest) as restored:
        path = restored.load_sync()
        assert path is not None
        assert sorted(p.name for p in path.iterdir()) == [f"checkpoint-{step}" for step in range(1, 5)]


def test_without_incremental_the_object_is_an_archive(tmp_path: Path) -> None:
    output = tmp_path / "output"
    output.mkdir()
    (output / "last.ckpt").write_bytes(b"state")
    dest = tmp_path / "ckpt"
    with Checkpoint(dest) as checkpoint:
        DirectoryMirror(incremental=False).save(checkpoint, output)
    assert dest.read_bytes()[:2] == b"\x1f\x8b"
