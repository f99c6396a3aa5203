"""A SIGTERM on ONE of 4 gloo ranks: every rank agrees on the step, saves it, and exits; none hangs.

Each rank trains with a gradient all-reduce per step and calls ``manager.reached_preemption(step)``
every step; one rank sends itself a real SIGTERM, which the preemption handler records. A rank
acting on its own notice would enter the save's collectives alone and wait there until the
process-group timeout; the launch is bounded and kills every rank it started on failure.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from flyte_checkpoint.distributed import DistributedCheckpointManager, checkpoint_failure
from flyte_checkpoint.errors import PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.preemption.ranks import PEER_SOURCE
from tests.distributed import ranks
from tests.distributed.checks import load_here
from tests.distributed.programs import full_state
from tests.stores import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

WORLD = 4
PG_TIMEOUT = 20  # a rank stuck in a collective fails the launch well within its timeout
LAUNCH_TIMEOUT = 60


def _run(store: Store, **args: object) -> list[dict[str, object]]:
    return ranks.run(
        "train_until_preempted",
        WORLD,
        {"root": store.uri("ckpt"), "pg_timeout": PG_TIMEOUT, **args},
        timeout=LAUNCH_TIMEOUT,
    )


def test_a_sigterm_on_one_rank_stops_every_rank_at_the_same_step_with_that_step_saved(
    local_store: Store,
) -> None:
    results = _run(local_store, sigterm=[2, 7])
    assert [result["saved"] for result in results] == [7] * WORLD
    assert [result["steps"] for result in results] == [[7]] * WORLD
    assert all(result["committed"] is True and result["code"] == 143 for result in results), results
    state = load_here(DistributedCheckpointManager(local_store.uri("ckpt")).checkpoint_dir(7))
    assert state["extra"]["seed"] == 7
    for name, tensor in full_state(0).items():
        assert torch.equal(state["model"][name], torch.full_like(tensor, 7.0)), name


def test_the_ranks_without_the_signal_stop_on_the_notice_of_the_rank_with_it(local_store: Store) -> None:
    results = _run(local_store, sigterm=[0, 3])
    assert [result["source"] for result in results] == ["SIGTERM"] + [PEER_SOURCE] * (WORLD - 1)


def test_a_sigterm_at_a_random_instant_stops_every_rank_at_one_step(local_store: Store) -> None:
    results = _run(local_store, sigterm_after=[3, 0.4])
    saved = {result["saved"] for result in results}
    assert len(saved) == 1, results
    assert None not in saved, "the loop ended before the signal came"


def test_ranks_voting_at_different_steps_all_fail_instead_of_saving_different_steps(
    local_store: Store,
) -> None:
    outcome = ranks.launch(
        "train_until_preempted",
        WORLD,
        {"root": local_store.uri("ckpt"), "pg_timeout": PG_TIMEOUT, "skew": {"1": 1}},
        timeout=LAUNCH_TIMEOUT,
    )
    assert sorted(outcome.errors) == list(range(WORLD)), outcome
    assert all("at different steps (1 to 2" in text for text in outcome.errors.values()), outcome.errors


def test_without_a_process_group_the_answer_is_this_process_notice(local_store: Store) -> None:
    notice.clear()
    try:
        with DistributedCheckpointManager(local_store.uri("ckpt")) as manager:
            assert manager.reached_preemption(5) is False
            notice.notify("SIGTERM", 30.0, 15)
            assert manager.reached_preemption(6) is True
            assert notice.taken_over()
    finally:
        notice.clear()


def test_a_save_after_the_save_deadline_is_stopped_and_the_previous_step_stays_newest(
    local_store: Store,
) -> None:
    manager = DistributedCheckpointManager(local_store.uri("ckpt"))
    manager.save(1, {"weights": torch.ones(4)})
    notice.clear()
    try:
        notice.notify("SIGTERM", 0.001, 15)  # the deadline has passed
        with pytest.raises(CheckpointException) as raised:
            manager.save(2, {"weights": torch.zeros(4)})
        assert isinstance(checkpoint_failure(raised.value), PreemptionDeadlineError)
        assert manager.steps() == [1]
        assert manager.preemption().saved is False
    finally:
        notice.clear()
