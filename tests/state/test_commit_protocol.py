"""The rank/coordinator protocol: version ids, positions from the environment, acknowledgements."""

from __future__ import annotations

import time

import pytest

from flyte_checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.state import begin, commit, read_part, save_checkpoint, write_part
from tests.state.workers import Unit
from tests.stores import Store


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)


def test_a_rank_writes_at_the_position_its_rank_variable_gives(
    local_store: Store, two_ranks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    version = begin(checkpoint_dir)
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert write_part(checkpoint_dir, None, f"rank {rank}".encode(), version_id=version).position == rank
    commit(checkpoint_dir, version, world_size=2, timeout=10)
    monkeypatch.setenv("RANK", "1")
    assert read_part(checkpoint_dir) == b"rank 1"


def test_a_rank_not_below_the_world_size_is_a_configuration_error(
    local_store: Store, two_ranks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigurationError, match=r"RANK=2 is not below the world size 2"):
        write_part(local_store.uri("ckpt"), None, b"x", version_id=begin(local_store.uri("ckpt")))


def test_a_rank_reading_with_another_world_size_gets_both_counts(
    local_store: Store, two_ranks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    save_checkpoint(checkpoint_dir, controller=None, parts=[Unit(), Unit(), Unit()])
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="has 3 parts, but the running system has 2"):
        read_part(checkpoint_dir)


def test_a_caller_chosen_version_id_lets_ranks_write_without_being_told(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    version = "step-1000-attempt-0"
    write_part(checkpoint_dir, 0, b"written before begin() returned", version_id=version)
    assert begin(checkpoint_dir, version_id=version) == version
    commit(checkpoint_dir, version, world_size=1, timeout=10)
    assert read_part(checkpoint_dir, 0, world_size=1) == b"written before begin() returned"


@pytest.mark.parametrize("version", ["", "../escape", "a/b", ".hidden", "x" * 129, 7])
def test_a_version_id_that_is_not_one_safe_path_segment_is_rejected(
    local_store: Store, version: object
) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="version id"):
        begin(local_store.uri("ckpt"), version_id=version)  # type: ignore[arg-type]


def test_committing_the_committed_version_again_is_refused(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    version = begin(checkpoint_dir)
    write_part(checkpoint_dir, 0, b"x", version_id=version)
    commit(checkpoint_dir, version, world_size=1, timeout=10)
    with pytest.raises(InvalidCheckpointInputError, match="is the committed checkpoint"):
        commit(checkpoint_dir, version, world_size=1, timeout=10)
    with pytest.raises(InvalidCheckpointInputError, match="is the committed checkpoint"):
        begin(checkpoint_dir, version_id=version)
    assert read_part(checkpoint_dir, 0, world_size=1) == b"x"


def test_an_acknowledgement_beyond_the_world_size_fails_the_commit_at_once(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    version = begin(checkpoint_dir)
    write_part(checkpoint_dir, 0, b"x", version_id=version)
    write_part(checkpoint_dir, 5, b"x", version_id=version)
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"part 5 failed: .*expects only 2 parts"):
        commit(checkpoint_dir, version, world_size=2, timeout=30)
    assert time.monotonic() - started < 5


def test_a_version_pinned_by_the_coordinator_that_was_replaced_is_not_read(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    pinned = save_checkpoint(checkpoint_dir, controller=None, parts=[Unit()]).version_id
    save_checkpoint(checkpoint_dir, controller=None, parts=[Unit()])
    with pytest.raises(CheckpointNotFoundError, match=f"version {pinned} is not the committed checkpoint"):
        read_part(checkpoint_dir, 0, version_id=pinned)


def test_workers_must_name_one_process_per_position(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    with pytest.raises(InvalidCheckpointInputError, match="workers lists 1 processes for 2 parts"):
        commit(checkpoint_dir, begin(checkpoint_dir), world_size=2, workers=[12345], timeout=1)
