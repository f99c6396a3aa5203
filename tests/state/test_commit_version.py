"""The public commit step: acknowledgements gathered by the caller (a torch.distributed ``finish()``,
Ray actors) are committed with no acknowledgement files and no process watching."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flyte_checkpoint import CheckpointError, InvalidCheckpointInputError
from flyte_checkpoint.state import CheckpointManager, PartAck, StateCheckpoint
from flyte_checkpoint.state.layout import Layout
from flyte_checkpoint.state.pointer import read_pointer
from tests.state.workers import Controller, Notes, Unit
from tests.stores import Store

WORLD_SIZE = 3


def checkpoint_in(store: Store) -> StateCheckpoint:
    return StateCheckpoint(store.uri("ckpt"), storage_options=store.storage_options, timeout=60)


def ranks_write(checkpoint: StateCheckpoint, version: str, label: str) -> list[PartAck]:
    """Each rank (a thread here) stores its own part and returns its ack to whoever gathers them."""

    def rank(position: int) -> PartAck:
        return checkpoint.write_part(position, Unit({position: f"{label} {position}"}), version_id=version)

    with ThreadPoolExecutor(WORLD_SIZE) as pool:
        return list(pool.map(rank, range(WORLD_SIZE)))


def loaded_units(checkpoint: StateCheckpoint) -> list[dict[int, str]]:
    units = [Unit() for _ in range(WORLD_SIZE)]
    checkpoint.load(controller=Controller(), parts=units)
    return [unit.data for unit in units]


def test_acks_gathered_by_the_caller_are_committed_without_any_acknowledgement_in_storage(
    store: Store,
) -> None:
    checkpoint = checkpoint_in(store)
    version = checkpoint.begin()
    acks = ranks_write(checkpoint, version, "new")

    manifest = checkpoint.commit_version(
        version, list(reversed(acks)), controller=Controller({7}, step=7), metadata={"step": 7}
    )

    assert [part.position for part in manifest.parts] == list(range(WORLD_SIZE))
    assert manifest.metadata == {"step": 7}
    assert loaded_units(checkpoint) == [{rank: f"new {rank}"} for rank in range(WORLD_SIZE)]
    layout = Layout.of(checkpoint.root, store.storage_options)
    assert not any("/acks/" in uri for uri in layout.backend.list_prefix(layout.version_uri(version)))


def save_previous(checkpoint: StateCheckpoint) -> str:
    version = checkpoint.begin()
    return checkpoint.commit_version(
        version, ranks_write(checkpoint, version, "previous"), controller=Controller()
    ).version_id


def test_an_ack_whose_object_is_missing_fails_the_commit_and_keeps_the_previous_checkpoint(
    local_store: Store,
) -> None:
    checkpoint = checkpoint_in(local_store)
    previous = save_previous(checkpoint)
    version = checkpoint.begin()
    acks = ranks_write(checkpoint, version, "new")
    layout = Layout.of(checkpoint.root)
    layout.backend.delete(layout.object_uri(version, acks[1].name))

    with pytest.raises(
        CheckpointError, match=r"part 1 failed: it was acknowledged, but its object is missing"
    ):
        checkpoint.commit_version(version, acks, controller=Controller())

    assert read_pointer(layout).version_id == previous  # type: ignore[union-attr]
    assert layout.list_versions() == [previous]
    assert loaded_units(checkpoint) == [{rank: f"previous {rank}"} for rank in range(WORLD_SIZE)]


@pytest.mark.parametrize(
    ("keep", "message"),
    [([0, 2], "part 1 has none"), ([0, 1, 1, 2], "part 1 is acknowledged twice")],
)
def test_acks_that_skip_or_repeat_a_position_are_refused(
    local_store: Store, keep: list[int], message: str
) -> None:
    checkpoint = checkpoint_in(local_store)
    previous = save_previous(checkpoint)
    version = checkpoint.begin()
    acks = ranks_write(checkpoint, version, "new")
    with pytest.raises(InvalidCheckpointInputError, match=message):
        checkpoint.commit_version(version, [acks[position] for position in keep], controller=Controller())
    assert read_pointer(Layout.of(checkpoint.root)).version_id == previous  # type: ignore[union-attr]


def test_a_controller_given_as_bytes_is_stored_and_read_back_by_a_file_component(local_store: Store) -> None:
    checkpoint = checkpoint_in(local_store)
    version = checkpoint.begin()
    checkpoint.commit_version(
        version, ranks_write(checkpoint, version, "new"), controller=b"plan of the save"
    )
    notes = Notes()
    checkpoint.load_controller(notes)
    assert notes.text == "plan of the save"


def test_a_state_checkpoint_crosses_processes_with_its_configuration(tmp_path: Path) -> None:
    checkpoint = StateCheckpoint(
        tmp_path / "ckpt", storage_options={"fsync": True}, timeout=12.5, max_workers=2
    )
    copy = pickle.loads(pickle.dumps(checkpoint))
    assert (copy.root, copy.storage_options, copy.timeout, copy.max_workers) == (
        checkpoint.root,
        {"fsync": True},
        12.5,
        2,
    )
    version = copy.begin()
    copy.commit_version(version, ranks_write(copy, version, "copied"), controller=Controller())
    assert loaded_units(checkpoint) == [{rank: f"copied {rank}"} for rank in range(WORLD_SIZE)]


def test_the_manager_commits_gathered_acks_of_a_step_and_applies_retention(local_store: Store) -> None:
    manager = CheckpointManager(local_store.uri("run"), keep_last=1)
    for step in (1000, 2000):
        step_checkpoint = manager.at(step)
        version = step_checkpoint.begin()
        acks = ranks_write(step_checkpoint, version, f"step {step}")
        manager.commit_version(step, version, acks, controller=Controller({step}, step=step))
    assert manager.steps() == [2000]
    assert loaded_units(manager.at(2000)) == [{rank: f"step 2000 {rank}"} for rank in range(WORLD_SIZE)]
