"""DistributedCheckpointManager's save and load tell a progress callback how far this rank got."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flyte_checkpoint.distributed import DistributedCheckpointManager

MiB = 1 << 20


@pytest.fixture(autouse=True)
def no_process_group_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def state(fill: float) -> dict[str, torch.Tensor]:
    return {"weights": torch.full((3 * MiB // 4,), fill), "bias": torch.full((16,), fill)}


def shard_sizes(root: Path) -> int:
    return sum(
        path.stat().st_size
        for path in (root / "step_0" / "versions").rglob("*")
        if path.is_file() and "shard" in path.name
    )


def test_a_save_tells_progress_how_many_bytes_of_the_shard_were_written(tmp_path: Path) -> None:
    manager = DistributedCheckpointManager(tmp_path / "ckpt")
    calls: list[tuple[int, int | None]] = []
    manager.save(0, state(1.0), progress=lambda done, total: calls.append((done, total)))
    assert len(calls) >= 2  # at least once per MiB, and once at the end
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert calls[-1] == (shard_sizes(tmp_path / "ckpt"), None)


def test_a_load_tells_progress_the_bytes_read_against_the_shards_size(tmp_path: Path) -> None:
    manager = DistributedCheckpointManager(tmp_path / "ckpt")
    manager.save(0, state(2.0))
    calls: list[tuple[int, int | None]] = []
    into = state(0.0)
    restored = manager.load(into, progress=lambda done, total: calls.append((done, total)))
    assert restored is not None
    assert torch.equal(into["weights"], state(2.0)["weights"])
    size = shard_sizes(tmp_path / "ckpt")
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert calls[-1] == (size, size)
    assert all(total == size for _, total in calls)


def test_a_pickled_writer_leaves_its_progress_callback_behind(tmp_path: Path) -> None:
    writer = DistributedCheckpointManager(tmp_path / "ckpt").writer(0, progress=lambda done, total: None)
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.progress is None
    assert writer.progress is not None
