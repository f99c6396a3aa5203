"""Loads verify every item they read: a damaged or missing shard is named, and the manager falls
back to the previous step; retention keeps the newest steps."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.distributed.checkpoint.api import CheckpointException

from flyte_checkpoint.distributed import DistributedCheckpointManager, checkpoint_failure
from flyte_checkpoint.errors import CheckpointCorruptError, CheckpointNotFoundError
from tests.conftest import damage_in_place
from tests.distributed import ranks
from tests.distributed.checks import empty_app_state, load_here, matches_seed
from tests.distributed.programs import full_state
from tests.stores import Store


@pytest.fixture(autouse=True)
def single_process_warning_ignored() -> Iterator[None]:
    """The test process loads without a process group; DCP warns about that every time."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _only_version(checkpoint_dir: Path) -> Path:
    (version,) = (checkpoint_dir / "versions").iterdir()
    return version


def test_a_damaged_shard_fails_the_load_naming_the_shard(local_store: Store) -> None:
    root = local_store.uri("ckpt")
    ranks.run("save", 2, {"root": root, "seed": 5})
    shard = _only_version(Path(root)) / "shard-00001.distcp"
    damage_in_place(shard, 40, b"\xff\xfe\xfd\xfc")
    with pytest.raises(CheckpointException) as raised:
        load_here(root)
    failure = checkpoint_failure(raised.value)
    assert isinstance(failure, CheckpointCorruptError)
    assert "shard-00001.distcp" in str(failure)


def test_a_missing_shard_fails_the_load_naming_the_shard(local_store: Store) -> None:
    root = local_store.uri("ckpt")
    ranks.run("save", 2, {"root": root, "seed": 5})
    (_only_version(Path(root)) / "shard-00000.distcp").unlink()
    with pytest.raises(CheckpointException) as raised:
        load_here(root)
    failure = checkpoint_failure(raised.value)
    assert isinstance(failure, CheckpointCorruptError)
    assert "shard-00000.distcp" in str(failure)


def test_a_load_of_a_directory_with_nothing_committed_says_so(local_store: Store) -> None:
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        DistributedCheckpointManager(local_store.base).load(empty_app_state(), step=3)


def test_the_manager_keeps_the_newest_steps_and_falls_back_past_a_damaged_one(local_store: Store) -> None:
    root = local_store.uri("steps")
    result = ranks.run("manager_steps", 2, {"root": root, "keep_last": 2, "save": [1, 2, 3]})[0]
    assert result["steps"] == [2, 3]
    assert result["restored"] == 3
    assert matches_seed(result["params"], 3)
    damage_in_place(_only_version(Path(root) / "step_3") / "shard-00000.distcp", 8, b"\x00\x01\x02\x03")
    manager = DistributedCheckpointManager(root, keep_last=2)
    state = empty_app_state()
    restored = manager.load(state)
    assert restored is not None
    assert restored.step == 2
    assert matches_seed(state["model"], 2)
    assert state["extra"]["seed"] == 2
    with pytest.raises(CheckpointCorruptError, match=r"shard-00000\.distcp"):
        manager.load(empty_app_state(), step=3)


def test_the_manager_in_one_process_saves_and_restores_steps(local_store: Store) -> None:
    """World size 1 without a process group, as in Flyte's local mode."""
    manager = DistributedCheckpointManager(local_store.base, keep_last=1)
    assert manager.load(empty_app_state()) is None
    saved = empty_app_state()
    for step in (4, 5):
        saved["model"] = full_state(step)
        saved["extra"] = {"seed": step, "note": "one process"}
        manager.save(step, saved)
    assert manager.steps() == [5]
    state = empty_app_state()
    restored = manager.load(state)
    assert restored is not None
    assert (restored.step, restored.metadata) == (5, {"step": 5})
    assert matches_seed(state["model"], 5)
