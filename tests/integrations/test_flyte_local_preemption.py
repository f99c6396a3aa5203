"""A SIGTERM during a run in the SDK's local mode behaves as on a cluster: the attempt sees the
notice, its final save commits, it ends preempted, and the SDK's local retry resumes from that
save; with no retry left the process exits 143 having saved. Real processes, real SIGTERMs.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.faults.signals.processes import running
from tests.runner_programs import STEPS

PROGRAM = "tests.integrations.flyte_local_run"


def _preempted_run(argv: list[str]) -> tuple[int, list[str], dict[str, Any]]:
    """Run the program, SIGTERM it once its first attempt is ready; its status, lines and outcome."""
    with running(argv, module=PROGRAM) as program:
        program.wait_for_line("ready")
        program.send(signal.SIGTERM)
        status = program.finish()
    outcome = json.loads(program.lines[-1]) if program.lines and program.lines[-1].startswith("{") else {}
    return status, program.lines, outcome


@pytest.mark.parametrize("entry", ["runcontext", "run", "aio"])
def test_a_local_run_saves_on_a_sigterm_and_its_local_retry_resumes_from_the_save(
    entry: str, tmp_path: Path
) -> None:
    status, lines, outcome = _preempted_run([str(tmp_path / "raw"), "--retries", "1", "--entry", entry])
    assert status == 0, "\n".join(lines)
    assert "saved 2" in lines
    assert "attempt 1 starts at 2" in lines
    assert outcome == {"result": STEPS, "handler_restored": True}


@pytest.mark.parametrize("use_async", [False, True], ids=["def", "async"])
def test_a_local_run_with_no_retry_left_ends_preempted_having_saved(use_async: bool, tmp_path: Path) -> None:
    argv = [str(tmp_path / "raw"), "--retries", "0", *(["--async"] if use_async else [])]
    status, lines, outcome = _preempted_run(argv)
    assert status == 0, "\n".join(lines)
    assert outcome == {"preempted": {"saved": True, "code": 143}, "handler_restored": True}
    assert (tmp_path / "raw" / "checkpoint").read_bytes() == b"2"


def test_a_local_task_that_ignores_the_notice_is_ended_once_its_save_commits_and_retried(
    tmp_path: Path,
) -> None:
    argv = [str(tmp_path / "raw"), "--retries", "1", "--async", "--unhandled"]
    status, lines, outcome = _preempted_run(argv)
    assert status == 0, "\n".join(lines)
    assert "attempt 1 starts at 2" in lines
    assert outcome == {"result": STEPS, "handler_restored": True}


def test_a_script_whose_local_run_is_preempted_exits_143_having_saved(tmp_path: Path) -> None:
    status, lines, _ = _preempted_run([str(tmp_path / "raw"), "--retries", "0", "--uncaught"])
    assert status == 143, "\n".join(lines)
    assert (tmp_path / "raw" / "checkpoint").read_bytes() == b"2"
