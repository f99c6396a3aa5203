"""The ``flyte-checkpoint run`` command, as a platform's container entry would call it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from flyte_checkpoint.cli import EXIT_INTERRUPTED, EXIT_PREEMPTED
from tests.faults.signals.processes import Program, running

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, attempt: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FLYTE_ATTEMPT_NUMBER", None)
    if attempt is not None:
        env["FLYTE_ATTEMPT_NUMBER"] = str(attempt)
    return subprocess.run(
        [sys.executable, "-m", "flyte_checkpoint", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_run_executes_the_task_with_its_checkpoint_paths_and_prints_the_result(tmp_path: Path) -> None:
    (tmp_path / "prev").write_bytes(b"40")
    result = run_cli(
        "run",
        "--checkpoint-path",
        str(tmp_path / "cur"),
        "--prev-checkpoint",
        str(tmp_path / "prev"),
        "tests.runners.test_runners:add_from_checkpoint",
        "--inputs",
        '{"increment": 2}',
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == 42
    assert (tmp_path / "cur").read_bytes() == b"42"


def test_run_resumes_across_separate_processes_like_a_remote_retry(tmp_path: Path) -> None:
    cur, prev = tmp_path / "cur", tmp_path / "prev"
    outputs = []
    for attempt in range(3):
        if cur.exists():
            prev.write_bytes(cur.read_bytes())  # what the platform stages between attempts
        result = run_cli(
            "run",
            "--checkpoint-path",
            str(cur),
            "--prev-checkpoint",
            str(prev),
            "tests.runners.test_runners:add_from_checkpoint",
            "--inputs",
            '{"increment": 10}',
            attempt=attempt,
        )
        assert result.returncode == 0, result.stderr
        outputs.append(json.loads(result.stdout))
    assert outputs == [10, 20, 30]


def test_a_failing_task_exits_1_with_one_clear_line(tmp_path: Path) -> None:
    result = run_cli("run", "--checkpoint-path", str(tmp_path / "cur"), "os:getcwd", "--inputs", '{"bad": 1}')
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("flyte-checkpoint: task failed: TypeError")
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = run_cli(
        "--debug", "run", "--checkpoint-path", str(tmp_path / "c"), "os:getcwd", "--inputs", '{"x": 1}'
    )
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_inputs_that_are_not_a_json_object_are_refused(tmp_path: Path) -> None:
    result = run_cli("run", "--checkpoint-path", str(tmp_path / "c"), "os:getcwd", "--inputs", "[1, 2]")
    assert result.returncode != 0
    assert "JSON object" in result.stderr


def test_help_shows_an_example() -> None:
    result = run_cli("run", "--help")
    assert result.returncode == 0
    assert "example: flyte-checkpoint run" in result.stdout


def preempted_run(checkpoint: Path, inputs: str) -> tuple[int, Program]:
    """:func:`counting_under_run`, sent SIGTERM while it waits for it; the exit status."""
    with counting_under_run(checkpoint, inputs) as program:
        program.wait_for_line("ready")
        program.send(signal.SIGTERM)
        return program.finish(), program


def test_run_exits_with_its_preempted_status_when_a_checkpoint_was_saved_after_the_notice(
    tmp_path: Path,
) -> None:
    status, program = preempted_run(tmp_path / "cur", '{"signals": 1}')
    assert status == EXIT_PREEMPTED == 75, program.output()
    assert (tmp_path / "cur").read_bytes() == b"2"
    assert program.lines[-1].startswith("flyte-checkpoint: preempted by SIGTERM")


def test_run_exits_with_its_preempted_status_when_the_save_sent_to_the_background_at_the_notice_commits(
    tmp_path: Path,
) -> None:
    status, program = preempted_run(tmp_path / "cur", '{"signals": 1, "in_background": true}')
    assert status == EXIT_PREEMPTED, program.output()
    assert (tmp_path / "cur").read_bytes() == b"2"


def counting_under_run(checkpoint: Path, inputs: str) -> AbstractContextManager[Program]:
    """``flyte-checkpoint run`` of the counting task of ``tests.runner_programs`` with a 5 s grace period."""
    argv = ["run", "--checkpoint-path", str(checkpoint), "--grace-seconds", "5", "--inputs", inputs]
    return running([*argv, "tests.runner_programs:count"], module="flyte_checkpoint")


def test_a_second_sigterm_while_run_exits_after_a_preemption_does_not_change_its_status(
    tmp_path: Path,
) -> None:
    with counting_under_run(tmp_path / "cur", '{"signals": 1, "linger_at_exit": true}') as program:
        program.wait_for_line("ready")
        program.send(signal.SIGTERM)
        program.wait_for_line("exiting")
        program.send(signal.SIGTERM)  # a wrapper forwarding it again, or the kubelet after a cloud notice
        status = program.finish()
    assert status == EXIT_PREEMPTED, program.output()
    assert (tmp_path / "cur").read_bytes() == b"2"


def test_run_exits_128_plus_the_signal_when_nothing_was_saved_after_the_notice(tmp_path: Path) -> None:
    status, program = preempted_run(tmp_path / "cur", '{"signals": 1, "save_on_notice": false}')
    assert status == 128 + signal.SIGTERM, program.output()
    assert not (tmp_path / "cur").exists()


def test_help_lists_the_exit_statuses_of_run() -> None:
    result = run_cli("run", "--help")
    described = " ".join(result.stdout.split())
    assert "75 run: preempted after a checkpoint saved after the notice committed" in described
    assert "128+N run: preempted by signal N" in described


def test_a_grace_period_that_is_not_a_number_of_seconds_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli("run", "--checkpoint-path", str(tmp_path / "c"), "--grace-seconds", "0", "os:getcwd")
    assert result.returncode == 2
    assert "--grace-seconds: '0' is not a number of seconds > 0" in result.stderr


def test_run_without_an_attempt_number_leaves_a_correct_previous_uri_as_it_is(tmp_path: Path) -> None:
    prev = "s3://bucket/metadata/run-abc/train/5/prev_checkpoint"
    names = ["--run-name", "run-abc", "--action-name", "train", "-o", "anon=true"]
    checkpoint = ["--checkpoint-path", str(tmp_path / "cur"), "--prev-checkpoint", prev]
    result = run_cli("run", *checkpoint, *names, "tests.runner_programs:previous_location")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == prev


def test_run_repairs_a_previous_uri_naming_the_current_attempt(tmp_path: Path) -> None:
    prev = "s3://bucket/metadata/run-abc/train/5/prev_checkpoint"
    names = ["--run-name", "run-abc", "--action-name", "train", "-o", "anon=true"]
    checkpoint = ["--checkpoint-path", str(tmp_path / "cur"), "--prev-checkpoint", prev]
    result = run_cli("run", *checkpoint, *names, "tests.runner_programs:previous_location", attempt=5)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == "s3://bucket/metadata/run-abc/train/4/prev_checkpoint"


def test_a_handler_the_task_installs_over_the_runners_is_warned_of_once_and_the_notice_still_counts(
    tmp_path: Path,
) -> None:
    with counting_under_run(tmp_path / "cur", '{"signals": 1, "own_handler": true}') as program:
        program.wait_for_line("ready")
        program.wait_for_line("WARNING flyte_checkpoint: the SIGTERM handler", timeout=15, prefix=True)
        program.send(signal.SIGTERM)
        status = program.finish()
    warnings = [line for line in program.lines if "handler flyte_checkpoint installed" in line]
    assert len(warnings) == 1, program.output()
    assert "reclaim_signals()" in warnings[0]
    assert "task handler" in program.lines
    assert status == EXIT_PREEMPTED, program.output()
    assert (tmp_path / "cur").read_bytes() == b"2"


def interrupted_run(checkpoint: Path, inputs: dict[str, bool]) -> tuple[int, Program]:
    """``flyte-checkpoint run`` of the task of ``tests.runner_programs`` that saves and waits, sent
    SIGINT (Ctrl-C) while it waits; the exit status."""
    argv = ["run", "--checkpoint-path", str(checkpoint), "--inputs", json.dumps(inputs)]
    argv.append("tests.runner_programs:save_then_wait_for_ctrl_c")
    with running(argv, module="flyte_checkpoint") as program:
        program.wait_for_line("ready")
        program.send(signal.SIGINT)
        return program.finish(), program


@pytest.mark.parametrize("background", [False, True], ids=["blocking", "background"])
def test_ctrl_c_after_the_checkpoint_committed_says_when_it_committed_and_where(
    background: bool, tmp_path: Path
) -> None:
    status, program = interrupted_run(tmp_path / "cur", {"background": background})
    assert status == EXIT_INTERRUPTED == 128 + signal.SIGINT, program.output()
    said = program.lines[-1]
    assert said.startswith("flyte-checkpoint: interrupted after the checkpoint saved at "), program.output()
    assert f"UTC committed to {tmp_path / 'cur'}; an attempt that restores from there resumes from it" in said
    assert (tmp_path / "cur").read_bytes() == b"7"


def test_ctrl_c_before_any_save_committed_says_so(tmp_path: Path) -> None:
    status, program = interrupted_run(tmp_path / "cur", {"save": False})
    assert status == EXIT_INTERRUPTED, program.output()
    said = "flyte-checkpoint: interrupted before any save of this attempt committed"
    assert program.lines[-1].startswith(said), program.output()
    assert not (tmp_path / "cur").exists()
