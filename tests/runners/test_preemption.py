"""The runners under preemption: the handler they install, and retries that count preemptions apart.

The runs that get a real SIGTERM are real processes (``tests/runner_programs.py``): the signal
is aimed at them, never at the test process.
"""

from __future__ import annotations

import json
import logging
import signal
import traceback
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import InvalidCheckpointInputError, ctx, load_and_run_task, run_with_retries
from flyte_checkpoint.context import CheckpointPaths
from flyte_checkpoint.errors import Preempted
from flyte_checkpoint.runners.retries import run_with_retries_async
from tests.faults.signals.processes import running
from tests.runner_programs import STEPS


def run_program(checkpoint_dir: Path, *flags: str, signals: int = 1) -> tuple[dict[str, Any], str]:
    """Run ``tests.runner_programs`` with ``flags``, SIGTERM each of its first ``signals`` attempts;
    its closing JSON and its whole output."""
    argv = [str(checkpoint_dir), "--signals", str(signals), *flags]
    with running(argv, module="tests.runner_programs") as program:
        for _ in range(signals):
            program.wait_for_line("ready")
            program.send(signal.SIGTERM)
        status = program.finish()
        assert status == 0, program.output()
        closing = next(line for line in reversed(program.lines) if line.startswith("{"))
        return json.loads(closing), program.output()


def preempted(saved: bool | None = True) -> Preempted:
    return Preempted("preempted by SIGTERM (a test)", source="SIGTERM", signal=signal.SIGTERM, saved=saved)


# -- a preempted attempt is retried on its own budget (real SIGTERMs) ---------------------------------


def test_a_preempted_attempt_saves_and_is_retried_without_using_a_retry(tmp_path: Path) -> None:
    outcome, output = run_program(tmp_path)
    assert outcome["result"] == STEPS
    assert "saved 2" in output
    assert "attempt 1 starts at 2" in output


def test_the_retry_after_a_preemption_is_logged_with_the_attempt_numbers_of_the_contexts(
    tmp_path: Path,
) -> None:
    _, output = run_program(tmp_path)
    assert "attempt 0 preempted (SIGTERM " in output
    assert "retrying as attempt 1 (preemption 1 of 10)" in output


def test_when_the_preemption_retries_are_used_up_the_preempted_is_raised(tmp_path: Path) -> None:
    outcome, output = run_program(tmp_path, "--preemption-retries", "1", signals=2)
    assert outcome["preempted"] == {"saved": True, "code": 128 + signal.SIGTERM}
    assert "attempt 1 starts at 2" in output
    assert "attempt 2 starts" not in output


def test_a_task_that_ignores_the_notice_is_ended_on_every_attempt_and_resumes(tmp_path: Path) -> None:
    outcome, output = run_program(tmp_path, "--unhandled", signals=2)
    assert outcome["result"] == STEPS
    assert "attempt 2 starts at 2" in output


def test_the_async_runner_retries_a_preempted_attempt_without_using_a_retry(tmp_path: Path) -> None:
    outcome, output = run_program(tmp_path, "--async")
    assert outcome["result"] == STEPS
    assert "attempt 1 starts at 2" in output


def test_the_async_runner_raises_the_preempted_when_the_preemption_retries_are_used_up(
    tmp_path: Path,
) -> None:
    outcome, _ = run_program(tmp_path, "--async", "--preemption-retries", "0")
    assert outcome["preempted"] == {"saved": True, "code": 128 + signal.SIGTERM}


def test_the_async_runner_ends_an_async_task_that_ignores_the_notice_by_cancelling_it(
    tmp_path: Path,
) -> None:
    outcome, output = run_program(tmp_path, "--async", "--unhandled")
    assert outcome["result"] == STEPS
    assert "attempt 1 starts at 2" in output


def test_a_handler_installed_before_the_runner_is_called_on_sigterm_and_restored_after(
    tmp_path: Path,
) -> None:
    outcome, _ = run_program(tmp_path, "--user-handler")
    assert outcome["result"] == STEPS
    assert outcome["user_handler_calls"] == 1
    assert outcome["user_handler_restored"] is True


def test_load_and_run_task_lets_the_preempted_of_its_one_attempt_propagate(tmp_path: Path) -> None:
    outcome, output = run_program(tmp_path, "--once")
    assert outcome["preempted"] == {"saved": True, "code": 128 + signal.SIGTERM}
    assert (tmp_path / "checkpoint").read_bytes() == b"2"
    assert "attempt 1" not in output


def test_load_and_run_task_tells_whether_a_task_ended_by_the_handler_saved_after_the_notice(
    tmp_path: Path,
) -> None:
    """The handler's watcher does not know (``saved=None``); the attempt's helper does. Which
    answer depends on whether a step's save committed between the SIGTERM and the ending."""
    outcome, _ = run_program(tmp_path, "--once", "--unhandled")
    assert outcome["preempted"]["saved"] in (True, False)
    assert outcome["preempted"]["code"] == 128 + signal.SIGTERM


# -- the budgets (no signal needed: the task raises Preempted itself) ---------------------------------


def test_a_preempted_attempt_does_not_use_up_a_retry(tmp_path: Path) -> None:
    def task() -> int:
        context = ctx()
        assert context is not None
        if context.attempt_number < 3:
            raise preempted()
        return context.attempt_number

    assert run_with_retries(task, retries=0, preemption_retries=3, checkpoint_dir=tmp_path) == 3


def test_failures_and_preemptions_are_counted_on_their_own_budgets(tmp_path: Path) -> None:
    endings: list[BaseException] = [preempted(), RuntimeError("boom"), preempted()]

    def task() -> str:
        if endings:
            raise endings.pop(0)
        return "done"

    assert run_with_retries(task, retries=1, preemption_retries=2, checkpoint_dir=tmp_path) == "done"


def test_the_last_preempted_is_raised_with_the_earlier_attempts_chained(tmp_path: Path) -> None:
    def task() -> None:
        raise preempted()

    with pytest.raises(Preempted) as caught:
        run_with_retries(task, retries=5, preemption_retries=1, checkpoint_dir=tmp_path)
    rendered = "".join(traceback.format_exception(caught.value))
    assert "attempt 0 preempted; retrying as attempt 1 (preemption 1 of 1)" in rendered
    assert "attempt 1 preempted; no preemption retries left (preemption_retries=1)" in rendered


def test_a_failure_after_preemptions_is_logged_with_the_attempt_number_it_had(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    endings: list[BaseException] = [preempted(), RuntimeError("boom")]

    def task() -> None:
        if endings:
            raise endings.pop(0)

    with caplog.at_level(logging.WARNING, logger="flyte_checkpoint"):
        run_with_retries(task, retries=1, checkpoint_dir=tmp_path)
    assert "attempt 1 failed (RuntimeError: boom); retrying as attempt 2 (retry 1 of 1)" in caplog.messages


async def test_the_async_runner_counts_preemptions_on_their_own_budget(tmp_path: Path) -> None:
    async def task() -> int:
        context = ctx()
        assert context is not None
        if context.attempt_number == 0:
            raise preempted()
        return context.attempt_number

    assert await run_with_retries_async(task, retries=0, checkpoint_dir=tmp_path) == 1


@pytest.mark.parametrize("budget", [-1, 1.5, True, "2"])
def test_preemption_retries_must_be_a_whole_number(tmp_path: Path, budget: object) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="preemption_retries"):
        run_with_retries(lambda: None, retries=0, preemption_retries=budget, checkpoint_dir=tmp_path)  # type: ignore[call-overload]


# -- the handler is installed for the run and put back after --------------------------------------


def test_the_runner_installs_the_handler_while_the_task_runs(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def task() -> bool:
        return signal.getsignal(signal.SIGTERM) is not before

    assert run_with_retries(task, retries=0, checkpoint_dir=tmp_path) is True


def test_the_previous_handler_is_back_after_the_runner_raises(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def task() -> None:
        raise preempted()

    with pytest.raises(Preempted):
        run_with_retries(task, retries=0, preemption_retries=0, checkpoint_dir=tmp_path)
    assert signal.getsignal(signal.SIGTERM) is before


def test_load_and_run_task_installs_the_handler_for_its_attempt(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)

    def task() -> bool:
        return signal.getsignal(signal.SIGTERM) is not before

    paths = CheckpointPaths(checkpoint_path=str(tmp_path / "cur"))
    assert load_and_run_task(task, checkpoint_paths=paths) is True
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_grace_period_that_is_not_a_number_of_seconds_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="grace_seconds"):
        run_with_retries(lambda: None, retries=0, grace_seconds=0, checkpoint_dir=tmp_path)
