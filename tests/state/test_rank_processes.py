"""Parts written and read by real, separate rank processes; failures of a rank never hang the commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from flyte_checkpoint import CheckpointError
from flyte_checkpoint.state import (
    begin,
    commit,
    load_checkpoint,
    load_controller,
    save_checkpoint,
    verify_checkpoint,
    write_part,
)
from flyte_checkpoint.state.layout import Layout
from flyte_checkpoint.state.pointer import read_pointer
from tests.state.conftest import SPAWN
from tests.state.workers import Controller, Unit, rank_loads_part, rank_writes_part
from tests.stores import Store

WORLD_SIZE = 4
# Generous, so that "promptly" below is measured against something much larger.
COMMIT_TIMEOUT = 60.0
PROMPT = 15.0


@pytest.fixture
def processes() -> Iterator[list[BaseProcess]]:
    """Started rank processes; any still running at the end of the test is killed and joined."""
    started: list[BaseProcess] = []
    yield started
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(10)


def start_ranks(
    processes: list[BaseProcess],
    store: Store,
    checkpoint_dir: str,
    version: str,
    modes: dict[int, str],
    world_size: int = WORLD_SIZE,
) -> list[BaseProcess]:
    ranks: list[BaseProcess] = []
    for rank in range(world_size):
        process = SPAWN.Process(
            target=rank_writes_part,
            args=(checkpoint_dir, version, rank, world_size, store.storage_options, modes.get(rank, "ok")),
            name=f"rank-{rank}",
        )
        process.start()
        processes.append(process)
        ranks.append(process)
    return ranks


def save_previous(store: Store, checkpoint_dir: str, world_size: int = WORLD_SIZE) -> str:
    manifest = save_checkpoint(
        checkpoint_dir,
        controller=Controller({0}),
        parts=[Unit({rank: "previous"}) for rank in range(world_size)],
        storage_options=store.storage_options,
    )
    return manifest.version_id


def assert_previous_is_loadable(
    store: Store, checkpoint_dir: str, version: str, world_size: int = WORLD_SIZE
) -> None:
    pointer = read_pointer(Layout.of(checkpoint_dir, store.storage_options))
    assert pointer is not None
    assert pointer.version_id == version
    units = [Unit() for _ in range(world_size)]
    load_checkpoint(
        checkpoint_dir, controller=Controller(), parts=units, storage_options=store.storage_options
    )
    assert [unit.data for unit in units] == [{rank: "previous"} for rank in range(world_size)]


def test_four_rank_processes_write_parts_that_the_coordinator_commits(
    any_store: Store, processes: list[BaseProcess]
) -> None:
    checkpoint_dir = any_store.uri("ckpt")
    version = begin(checkpoint_dir, storage_options=any_store.storage_options)
    ranks = start_ranks(processes, any_store, checkpoint_dir, version, {})

    manifest = commit(
        checkpoint_dir,
        version,
        world_size=WORLD_SIZE,
        controller=Controller({1, 2}, step=5),
        metadata={"step": 5},
        workers=ranks,
        timeout=COMMIT_TIMEOUT,
        storage_options=any_store.storage_options,
    )
    for process in ranks:
        process.join(10)
        assert process.exitcode == 0

    assert [part.position for part in manifest.parts] == list(range(WORLD_SIZE))
    controller, units = Controller(), [Unit() for _ in range(WORLD_SIZE)]
    metadata = load_checkpoint(
        checkpoint_dir, controller=controller, parts=units, storage_options=any_store.storage_options
    )
    assert metadata == {"step": 5}
    assert (controller.produced, controller.step) == ({1, 2}, 5)
    assert [unit.data for unit in units] == [
        {rank: f"rank {rank} state", 100: rank * 10} for rank in range(4)
    ]


def test_rank_processes_restore_their_own_parts_of_the_version_the_coordinator_verified(
    local_store: Store, processes: list[BaseProcess]
) -> None:
    store = local_store
    checkpoint_dir = store.uri("ckpt")
    save_checkpoint(
        checkpoint_dir,
        controller=Controller({7}, step=7),
        parts=[Unit({rank: f"saved {rank}"}) for rank in range(WORLD_SIZE)],
        metadata={"step": 7},
        storage_options=store.storage_options,
    )
    manifest = verify_checkpoint(checkpoint_dir, world_size=WORLD_SIZE, storage_options=store.storage_options)
    results: Any = SPAWN.Queue()
    for rank in range(WORLD_SIZE):
        process: BaseProcess = SPAWN.Process(
            target=rank_loads_part,
            args=(checkpoint_dir, manifest.version_id, rank, WORLD_SIZE, store.storage_options, results),
        )
        process.start()
        processes.append(process)
    controller = Controller()
    assert load_controller(
        checkpoint_dir, controller, version_id=manifest.version_id, storage_options=store.storage_options
    ) == {"step": 7}
    restored = dict(results.get(timeout=60) for _ in range(WORLD_SIZE))
    for process in processes:
        process.join(10)
        assert process.exitcode == 0
    results.close()
    results.join_thread()
    assert restored == {rank: {rank: f"saved {rank}"} for rank in range(WORLD_SIZE)}
    assert controller.step == 7


def write_in_process(store: Store, checkpoint_dir: str, version: str, positions: range | list[int]) -> None:
    for rank in positions:
        write_part(
            checkpoint_dir,
            rank,
            Unit({rank: f"rank {rank} state"}),
            version_id=version,
            storage_options=store.storage_options,
        )


def start_rank(
    processes: list[BaseProcess], store: Store, checkpoint_dir: str, version: str, rank: int, mode: str
) -> BaseProcess:
    process = SPAWN.Process(
        target=rank_writes_part,
        args=(checkpoint_dir, version, rank, WORLD_SIZE, store.storage_options, mode),
        name=f"rank-{rank}",
    )
    process.start()
    processes.append(process)
    return process


def test_a_part_writer_process_that_raises_fails_the_commit_promptly_naming_the_part_and_cause(
    store: Store, processes: list[BaseProcess]
) -> None:
    checkpoint_dir = store.uri("ckpt")
    previous = save_previous(store, checkpoint_dir)
    version = begin(checkpoint_dir, storage_options=store.storage_options)
    write_in_process(store, checkpoint_dir, version, [0, 1, 3])
    failing = start_rank(processes, store, checkpoint_dir, version, 2, "raise")

    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"part 2 failed: .*raised ValueError: disk of rank exploded"):
        commit(
            checkpoint_dir,
            version,
            world_size=WORLD_SIZE,
            workers={2: failing},
            timeout=COMMIT_TIMEOUT,
            storage_options=store.storage_options,
        )
    assert time.monotonic() - started < PROMPT
    assert_previous_is_loadable(store, checkpoint_dir, previous)


@pytest.mark.parametrize(
    ("mode", "status"), [("kill", "was killed by SIGKILL"), ("exit", "exited with code 3")]
)
def test_a_part_writer_process_that_dies_fails_the_commit_promptly_naming_the_part(
    local_store: Store, processes: list[BaseProcess], mode: str, status: str
) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    previous = save_previous(local_store, checkpoint_dir)
    version = begin(checkpoint_dir)
    write_in_process(local_store, checkpoint_dir, version, [0, 2, 3])
    dying = start_rank(processes, local_store, checkpoint_dir, version, 1, mode)

    started = time.monotonic()
    with pytest.raises(CheckpointError, match=rf"part 1 failed: its writer process \d+ {status}"):
        commit(checkpoint_dir, version, world_size=WORLD_SIZE, workers={1: dying}, timeout=COMMIT_TIMEOUT)
    assert time.monotonic() - started < PROMPT
    assert_previous_is_loadable(local_store, checkpoint_dir, previous)


def test_a_part_that_never_arrives_fails_the_commit_at_its_timeout_naming_it(local_store: Store) -> None:
    checkpoint_dir = local_store.uri("ckpt")
    previous = save_previous(local_store, checkpoint_dir)
    version = begin(checkpoint_dir)
    write_in_process(local_store, checkpoint_dir, version, range(3))

    started = time.monotonic()
    with pytest.raises(CheckpointError, match=r"timed out after 1\.5 s waiting for part 3 of 4"):
        commit(checkpoint_dir, version, world_size=WORLD_SIZE, timeout=1.5)
    assert 1.5 <= time.monotonic() - started < PROMPT
    assert_previous_is_loadable(local_store, checkpoint_dir, previous)


def test_a_coordinator_lock_held_elsewhere_fails_the_commit_at_its_timeout(local_store: Store) -> None:
    lock = threading.Lock()
    with lock, pytest.raises(CheckpointError, match=r"lock was not free within 0\.2 s"):
        commit(
            local_store.uri("ckpt"),
            begin(local_store.uri("ckpt")),
            world_size=0,
            controller=Controller(),
            lock=lock,
            timeout=0.2,
        )
