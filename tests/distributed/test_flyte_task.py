"""Inside a Flyte task every rank derives the same DCP roots; a retried attempt resumes from the
last step the previous attempt committed, on another world size or in one process."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from flyte_checkpoint import ctx
from flyte_checkpoint.context import CheckpointPaths, TaskContext
from flyte_checkpoint.distributed import DistributedCheckpointManager, task_locations
from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.runners.retries import run_with_retries
from tests.distributed import ranks
from tests.distributed.checks import empty_app_state, matches_seed
from tests.distributed.programs import full_state
from tests.stores import Store


def test_the_roots_sit_beside_the_attempts_checkpoint_and_the_previous_one() -> None:
    paths = CheckpointPaths(
        checkpoint_path="s3://bucket/run/a/2/checkpoint",
        prev_checkpoint_path="s3://bucket/run/a/1/checkpoint",
    )
    where = task_locations(TaskContext(checkpoint_paths=paths))
    assert where.save_root == "s3://bucket/run/a/2/checkpoint.dcp"
    assert where.resume_root == "s3://bucket/run/a/1/checkpoint.dcp"


def test_outside_a_task_there_is_no_location() -> None:
    with pytest.raises(ConfigurationError, match="inside a Flyte task"):
        task_locations(None)


def test_a_retried_attempt_on_two_ranks_resumes_from_the_step_four_ranks_committed(tmp_path: Path) -> None:
    first = str(tmp_path / "attempt-1" / "checkpoint")
    second = str(tmp_path / "attempt-2" / "checkpoint")
    outcome = ranks.launch(
        "flyte_attempt", 4, {"checkpoint_path": first, "until": 5, "die_after": 2}, timeout=60
    )
    assert outcome.exit_codes == {0: -9, 1: -9, 2: -9, 3: -9}
    result = ranks.run("flyte_attempt", 2, {"checkpoint_path": second, "prev": first, "until": 4})[0]
    assert result == {"resumed": 2, "steps": [3, 4]}


@pytest.fixture
def single_process_warning_ignored() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


@pytest.mark.usefixtures("single_process_warning_ignored")
def test_flyte_local_mode_retries_resume_in_one_process(local_store: Store) -> None:
    resumed: list[int] = []

    def train() -> int:
        context = ctx()
        assert context is not None
        where = task_locations(context)
        manager = DistributedCheckpointManager(where.save_root, resume_from=where.resume_root, keep_last=2)
        state = empty_app_state()
        restored = manager.load(state)
        start = restored.step if restored is not None else 0
        resumed.append(start)
        if restored is not None:
            assert matches_seed(state["model"], start)
        for step in range(start + 1, 5):
            manager.save(step, {"model": full_state(step), "extra": {"seed": step, "note": "local"}})
            if step == 2 and context.attempt_number == 0:
                raise RuntimeError("preempted")
        return step

    assert run_with_retries(train, retries=1, checkpoint_dir=local_store.base) == 4
    assert resumed == [0, 2]
