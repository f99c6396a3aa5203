"""A failure after a preemption notice is the preemption's doing: the runners count it as one."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from flyte_checkpoint import Preempted, PreemptionDeadlineError, ctx, current_checkpoint, run_with_retries
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.preemption.handler import install_preemption_handler
from flyte_checkpoint.runners.retries import RetryPlan


def refused_at_the_notice_then_done() -> str:
    """Attempt 0 gets a notice and its save is refused; the next attempt finishes."""
    context = ctx()
    assert context is not None
    if context.attempt_number == 0:
        notice.notify_signal(signal.SIGTERM, 30.0)
        raise PreemptionDeadlineError("not saving: no time is left")
    return "done"


def test_a_save_refused_at_the_notice_ends_the_attempt_as_preempted_not_failed(tmp_path: Path) -> None:
    assert (
        run_with_retries(
            refused_at_the_notice_then_done, retries=0, preemption_retries=1, checkpoint_dir=tmp_path
        )
        == "done"
    )


def test_the_failure_after_the_notice_is_kept_as_the_cause_of_the_preemption(tmp_path: Path) -> None:
    def task() -> None:
        current_checkpoint().save_sync(b"step 1")
        notice.notify_signal(signal.SIGTERM, 30.0)
        raise ValueError("a worker the SIGTERM ended")

    with pytest.raises(Preempted) as raised:
        run_with_retries(task, retries=3, preemption_retries=0, checkpoint_dir=tmp_path)
    assert isinstance(raised.value.__cause__, ValueError)
    assert "the attempt then failed with ValueError: a worker the SIGTERM ended" in str(raised.value)


def test_a_failure_without_a_notice_still_counts_against_the_users_retries(tmp_path: Path) -> None:
    def task() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        run_with_retries(task, retries=0, checkpoint_dir=tmp_path)


def test_an_attempt_that_ended_is_not_ended_again_while_the_runner_retries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watcher polls every 50 ms: a runner slow to start the next attempt (its bookkeeping,
    # staging from a slow store) used to get the "end the task" signal meant for the attempt
    # that had already ended, raised in its own code and out of run_with_retries.
    counted = RetryPlan.preempted

    def slow_bookkeeping(plan: RetryPlan, error: Preempted) -> None:
        time.sleep(0.5)
        counted(plan, error)

    monkeypatch.setattr(RetryPlan, "preempted", slow_bookkeeping)

    assert (
        run_with_retries(
            refused_at_the_notice_then_done, retries=0, preemption_retries=1, checkpoint_dir=tmp_path
        )
        == "done"
    )


def test_code_after_a_runner_is_ended_as_usual_when_it_does_not_handle_a_notice(tmp_path: Path) -> None:
    run_with_retries(lambda: None, retries=0, checkpoint_dir=tmp_path)

    def untended_training() -> None:
        with install_preemption_handler(grace_seconds=30.0):
            notice.notify_signal(signal.SIGTERM, 30.0)
            time.sleep(10)  # ended by the handler long before this returns

    with pytest.raises(Preempted):
        untended_training()
