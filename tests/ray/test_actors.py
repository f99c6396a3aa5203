"""Components as Ray actors, on a real three-node Ray cluster: each actor writes and loads its own
part, the driver commits; failures Ray detects (a dead actor, a lost node, a missed deadline)
raise this package's typed errors, commit nothing, and roll loads back."""

from __future__ import annotations

import pickle
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointPartError,
    CheckpointTimeoutError,
    UnsupportedTypeError,
)
from flyte_checkpoint.state import CheckpointManager, StateCheckpoint, load_checkpoint, save_checkpoint
from tests.ray.actors import NotAComponent, Unit
from tests.ray.conftest import RayCluster, Store, wait_until_entered

RemoteUnit = ray.remote(num_cpus=0)(Unit)
RemoteNotAComponent = ray.remote(num_cpus=0)(NotAComponent)


def unit_on(node: str, name: str = "") -> Any:
    return RemoteUnit.options(resources={node: 0.01}).remote(name)


UNIT_NODES = ("node0", "node0", "node1", "node2")
"""Where the controller and the three units live: one unit on each node."""


@pytest.fixture(scope="module")
def unit_pool(ray_cluster: RayCluster) -> Iterator[list[Any]]:
    pool = [unit_on(node) for node in UNIT_NODES]
    yield pool
    for actor in pool:
        ray.kill(actor)


@pytest.fixture
def units(unit_pool: list[Any]) -> list[Any]:
    """A controller on the head node and one unit on each of the three nodes, all reset; actors
    that an earlier test killed (or whose node it removed) are replaced."""
    for index, node in enumerate(UNIT_NODES):
        try:
            ray.get(unit_pool[index].reset.remote(), timeout=30)
        except ray.exceptions.RayError:
            unit_pool[index] = unit_on(node)
            ray.get(unit_pool[index].reset.remote(), timeout=30)
    return list(unit_pool)


def fill(actors: list[Any], generation: int) -> None:
    ray.get(
        [
            actor.put.remote(f"k{index}", f"v{index}-{generation}", generation)
            for index, actor in enumerate(actors)
        ]
    )


def snapshots(actors: list[Any]) -> list[dict[str, Any]]:
    return list(ray.get([actor.snapshot.remote() for actor in actors]))


def test_the_units_are_spread_over_three_nodes(units: list[Any]) -> None:
    assert len(set(ray.get([unit.node_id.remote() for unit in units[1:]]))) == 3


def test_actors_round_trip_with_metadata_into_fresh_actors_by_position(
    ray_cluster: RayCluster, units: list[Any], store: Store
) -> None:
    controller, *parts = units
    fill(units, generation=7)
    manifest = save_checkpoint(
        store.uri("ckpt"),
        controller=controller,
        parts=parts,
        metadata={"step": 7},
        storage_options=store.storage_options,
    )
    assert manifest.world_size == 3
    assert manifest.controller is not None

    fresh = [unit_on("node2"), unit_on("node1"), unit_on("node0"), unit_on("node1")]
    try:
        metadata = load_checkpoint(
            store.uri("ckpt"), controller=fresh[0], parts=fresh[1:], storage_options=store.storage_options
        )
        assert metadata == {"step": 7}
        assert snapshots(fresh) == snapshots(units)
    finally:
        for actor in fresh:
            ray.kill(actor)


def test_each_part_is_serialised_and_written_inside_its_own_actor(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    _, *parts = units
    checkpoint = StateCheckpoint(local_store.uri("ckpt"), serializer=PidStampingSerializer())
    checkpoint.save(controller=None, parts=parts)
    writers = [int(checkpoint.read_part(position).split(b":", 1)[0]) for position in range(3)]
    assert writers == ray.get([part.pid.remote() for part in parts])


class PidStampingSerializer:
    """Pickle, prefixed with the id of the process that serialised the state."""

    name = "pid-pickle"

    def dumps(self, obj: Any) -> bytes:
        import os

        return f"{os.getpid()}:".encode() + pickle.dumps(obj)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data.split(b":", 1)[1])


def test_a_count_mismatch_raises_value_error_naming_both_counts(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    controller, *parts = units
    save_checkpoint(local_store.uri("ckpt"), controller=controller, parts=parts)
    fill(units, generation=3)
    with pytest.raises(ValueError, match=r"has 3 parts, but the running system has 2"):
        load_checkpoint(local_store.uri("ckpt"), controller=controller, parts=parts[:2])
    assert [snapshot["generation"] for snapshot in snapshots(units)] == [3, 3, 3, 3]


def save_losing_part_2(
    checkpoint: StateCheckpoint, units: list[Any], hold_dir: Path, lose: Callable[[], None]
) -> CheckpointPartError:
    """Commit step 1, then save step 2 and call ``lose`` while part 2 captures its state; the
    error that save raised."""
    controller, *parts = units
    fill(units, generation=1)
    checkpoint.save(controller=controller, parts=parts, metadata={"step": 1})
    fill(units, generation=2)
    ray.get(parts[2].hold_in.remote("save", str(hold_dir)))
    with ThreadPoolExecutor(1) as pool:
        saving = pool.submit(checkpoint.save, controller=controller, parts=parts, metadata={"step": 2})
        wait_until_entered(hold_dir)
        lose()
        with pytest.raises(CheckpointPartError) as caught:
            saving.result()
    return caught.value


def assert_previous_checkpoint_loads(
    checkpoint: StateCheckpoint, survivors: list[Any], generation: int
) -> None:
    """The survivors and a fresh actor in place of the lost part 2 get the previous checkpoint."""
    replacement = unit_on("node1")
    try:
        actors = [*survivors, replacement]
        checkpoint.load(controller=actors[0], parts=actors[1:])
        assert [snapshot["generation"] for snapshot in snapshots(actors)] == [generation] * 4
    finally:
        ray.kill(replacement)


def test_an_actor_killed_mid_save_raises_a_part_error_and_keeps_the_previous_checkpoint(
    ray_cluster: RayCluster, units: list[Any], store: Store, hold_dir: Path
) -> None:
    checkpoint = StateCheckpoint(store.uri("ckpt"), storage_options=store.storage_options)
    error = save_losing_part_2(checkpoint, units, hold_dir, lambda: ray.kill(units[3]))
    assert error.position == 2
    assert re.search(r"part 2 failed: its actor died .*; nothing was saved", str(error))
    assert checkpoint.verify().metadata == {"step": 1}
    assert_previous_checkpoint_loads(checkpoint, units[:3], generation=1)


def test_a_node_lost_mid_save_raises_a_part_error_and_keeps_the_previous_checkpoint(
    ray_cluster: RayCluster, units: list[Any], store: Store, hold_dir: Path
) -> None:
    checkpoint = StateCheckpoint(store.uri("ckpt"), storage_options=store.storage_options)
    try:
        error = save_losing_part_2(checkpoint, units, hold_dir, lambda: ray_cluster.remove_node("node2"))
    finally:
        ray_cluster.restore_nodes()
    assert error.position == 2
    assert re.search(r"part 2 failed: its actor (died|is unreachable)", str(error))
    assert checkpoint.verify().metadata == {"step": 1}
    assert_previous_checkpoint_loads(checkpoint, units[:3], generation=1)


def test_a_part_that_misses_the_deadline_raises_a_timeout_naming_it(
    ray_cluster: RayCluster, units: list[Any], local_store: Store, hold_dir: Path
) -> None:
    controller, *parts = units
    checkpoint = StateCheckpoint(local_store.uri("ckpt"), timeout=1.5)
    fill(units, generation=1)
    checkpoint.save(controller=controller, parts=parts, metadata={"step": 1})
    ray.get(parts[1].hold_in.remote("save", str(hold_dir)))
    try:
        with pytest.raises(CheckpointTimeoutError, match=r"\(part 1 not done\)"):
            checkpoint.save(controller=controller, parts=parts, metadata={"step": 2})
    finally:
        (hold_dir / "release").touch()
    assert checkpoint.verify().metadata == {"step": 1}


def test_an_actor_killed_mid_load_raises_and_every_other_component_is_rolled_back(
    ray_cluster: RayCluster, units: list[Any], store: Store, hold_dir: Path
) -> None:
    controller, *parts = units
    checkpoint = StateCheckpoint(store.uri("ckpt"), storage_options=store.storage_options)
    fill(units, generation=1)
    checkpoint.save(controller=controller, parts=parts)
    fill(units, generation=2)
    ray.get(parts[1].hold_in.remote("load", str(hold_dir)))
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(checkpoint.load, controller=controller, parts=parts)
        wait_until_entered(hold_dir)
        ray.kill(parts[1])
        with pytest.raises(CheckpointPartError, match=r"part 1 failed: its actor died") as caught:
            loading.result()
    assert "every other component was rolled back" in str(getattr(caught.value, "__notes__", ""))
    survivors = [controller, parts[0], parts[2]]
    assert [snapshot["generation"] for snapshot in snapshots(survivors)] == [2, 2, 2]


def test_a_part_that_fails_to_apply_rolls_every_component_back(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    controller, *parts = units
    checkpoint = StateCheckpoint(local_store.uri("ckpt"))
    fill(units, generation=1)
    checkpoint.save(controller=controller, parts=parts)
    fill(units, generation=2)
    before = snapshots(units)
    ray.get(parts[2].fail_next_load.remote())
    with pytest.raises(CheckpointPartError, match=r"part 2 failed: applying its state raised RuntimeError"):
        checkpoint.load(controller=controller, parts=parts)
    assert snapshots(units) == before


def test_a_damaged_part_is_found_before_any_actor_is_touched(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    controller, *parts = units
    checkpoint = StateCheckpoint(local_store.uri("ckpt"))
    fill(units, generation=1)
    manifest = checkpoint.save(controller=controller, parts=parts)
    fill(units, generation=2)
    stored = Path(local_store.uri("ckpt")) / "versions" / manifest.version_id / "part-00001.bin"
    data = bytearray(stored.read_bytes())
    data[-3] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="part 1"):
        checkpoint.load(controller=controller, parts=parts)
    assert [snapshot["generation"] for snapshot in snapshots(units)] == [2, 2, 2, 2]


def test_a_mutation_under_the_lock_is_never_half_in_a_checkpoint(
    ray_cluster: RayCluster, units: list[Any], store: Store
) -> None:
    controller, *parts = units
    checkpoint = StateCheckpoint(store.uri("ckpt"), storage_options=store.storage_options)
    lock = threading.Lock()
    stop = threading.Event()

    def mutate() -> None:
        generation = 0
        while not stop.is_set():
            generation += 1
            with lock:  # one generation reaches every actor, waited for inside the lock
                fill(units, generation)

    mutator = threading.Thread(target=mutate)
    mutator.start()
    try:
        for _ in range(5):
            checkpoint.save(controller=controller, parts=parts, lock=lock)
            stored = [pickle.loads(checkpoint.read_part(position)) for position in range(3)]
            generations = {state["generation"] for state in stored}
            assert len(generations) == 1, f"a checkpoint mixes generations {generations}"
    finally:
        stop.set()
        mutator.join()


def test_the_manager_saves_and_restores_steps_of_actors(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    controller, *parts = units
    manager = CheckpointManager(local_store.base, keep_last=1)
    for step in (1, 2):
        fill(units, generation=step)
        manager.save(step, controller=controller, parts=parts, metadata={"step": step})
    assert manager.steps() == [2]
    fill(units, generation=9)
    restored = manager.load(controller=controller, parts=parts)
    assert restored is not None
    assert restored.metadata == {"step": 2}
    assert [snapshot["generation"] for snapshot in snapshots(units)] == [2, 2, 2, 2]


def test_an_actor_that_is_not_a_component_is_refused_with_nothing_committed(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    stranger: Any = RemoteNotAComponent.remote()
    try:
        checkpoint = StateCheckpoint(local_store.uri("ckpt"))
        with pytest.raises(UnsupportedTypeError, match=r"NotAComponent, which cannot be checkpointed"):
            checkpoint.save(controller=None, parts=[units[1], stranger])
        with pytest.raises(FileNotFoundError):
            checkpoint.verify()
    finally:
        ray.kill(stranger)


def test_a_controller_in_the_driver_is_saved_and_restored_with_actor_parts(
    ray_cluster: RayCluster, units: list[Any], local_store: Store
) -> None:
    _, *parts = units
    controller = Unit("driver-side")
    controller.put("produced", [0, 1, 2], generation=4)
    fill(parts, generation=4)
    checkpoint = StateCheckpoint(local_store.uri("ckpt"))
    checkpoint.save(controller=controller, parts=parts)
    controller.put("produced", [], generation=5)
    fill(parts, generation=5)
    checkpoint.load(controller=controller, parts=parts)
    assert controller.snapshot() == {"samples": {"produced": [0, 1, 2]}, "generation": 4}
    assert [snapshot["generation"] for snapshot in snapshots(parts)] == [4, 4, 4]
