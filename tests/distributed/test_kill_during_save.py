"""A rank or the coordinator SIGKILLed during a save over an existing checkpoint: every later load
gives exactly the old state or the new one (parameters and blobs of one save), never a mix, never
neither. Planned points cover each step of the protocol; timed kills cover the instants between."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from tests.distributed import ranks
from tests.distributed.checks import load_here, seed_of
from tests.stores import Store

RANK_POINTS = ["before_write", "mid_write", "after_write"]
COORDINATOR_POINTS = ["before_write", "mid_write", "before_metadata", "before_pointer", "after_pointer"]
# What a load must give after a kill at each point: the commit happens only past the pointer write.
EXPECTED = {"after_pointer": "new"}
PG_TIMEOUT = 15


def _kill_series(store: Store, kills: list[tuple[int, str]]) -> Counter[str]:
    """Save seed 1, then for each planned kill a save of a new seed; check every load in between."""
    root = store.uri("ckpt")
    options = {"storage_options": store.storage_options}
    ranks.run("save", 4, {"root": root, "seed": 1, **options})
    committed = 1
    outcomes: Counter[str] = Counter()
    for trial, (rank, point) in enumerate(kills, start=2):
        outcome = ranks.launch(
            "save",
            4,
            {"root": root, "seed": trial, "kill": [rank, point], "pg_timeout": PG_TIMEOUT, **options},
            timeout=60,
        )
        assert outcome.exit_codes[rank] == -9, f"rank {rank} was not killed at {point}: {outcome}"
        loaded = seed_of(load_here(root, store.storage_options), [committed, trial])
        assert loaded is not None, (
            f"a kill of rank {rank} at {point} left a mix of saves {committed} and {trial}"
        )
        label = "new" if loaded == trial else "old"
        assert label == EXPECTED.get(point, "old"), f"kill of rank {rank} at {point} gave the {label} state"
        outcomes[f"rank {rank} {point}: {label}"] += 1
        committed = loaded
    # A save after all those failures commits, and the orphaned versions are collected.
    ranks.run("save", 2, {"root": root, "seed": 99, **options})
    assert seed_of(load_here(root, store.storage_options), [99]) == 99
    return outcomes


def test_killing_a_rank_at_each_planned_point_leaves_the_old_checkpoint(local_store: Store) -> None:
    outcomes = _kill_series(local_store, [(2, point) for point in RANK_POINTS])
    assert sum(outcomes.values()) == len(RANK_POINTS)
    versions = list((Path(local_store.base) / "ckpt" / "versions").iterdir())
    assert len(versions) == 1


def test_killing_the_coordinator_at_each_planned_point_leaves_one_complete_checkpoint(
    local_store: Store,
) -> None:
    outcomes = _kill_series(local_store, [(0, point) for point in COORDINATOR_POINTS])
    assert sum(outcomes.values()) == len(COORDINATOR_POINTS)


def test_killing_a_rank_or_the_coordinator_on_s3_leaves_one_complete_checkpoint(s3_store: Store) -> None:
    _kill_series(s3_store, [(3, "mid_write"), (0, "before_pointer")])


@pytest.mark.parametrize("trial", range(3))
def test_a_rank_killed_at_a_random_instant_of_a_save_series_leaves_one_complete_save(
    trial: int, local_store: Store
) -> None:
    chooser = random.Random(trial)
    root = local_store.uri("ckpt")
    ranks.run("save", 4, {"root": root, "seed": 1})
    seeds = list(range(10, 50))  # long enough that the kill lands inside the series
    victim = chooser.randrange(4)
    outcome = ranks.launch(
        "save_series",
        4,
        {"root": root, "seeds": seeds, "pg_timeout": PG_TIMEOUT},
        timeout=60,
        kill_after=(victim, chooser.uniform(0.5, 1.5)),
    )
    assert outcome.exit_codes[victim] == -9, f"the series ended before rank {victim} was killed"
    loaded = seed_of(load_here(root), [1, *seeds])
    assert loaded is not None, f"killing rank {victim} left a mix of saves ({outcome.exit_codes})"
