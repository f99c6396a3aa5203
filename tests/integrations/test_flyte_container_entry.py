"""A preempted Flyte task attempt, run through the SDK's real container entry, offline.

Each attempt is its own process, ``python -m flyte._bin.runtime a0 ...``, as in a task pod: the
SDK loads the task with its default resolver from ``tests.integrations.flyte_container`` (which
installs the plugin), reads ``inputs.pb``, and writes ``outputs.pb`` or ``error.pb`` under the
attempt's outputs path. ``TORCHELASTIC_RUN_ID`` marks the process as a clustered worker, which
the entry runs without a controller (the one part that needs a Flyte endpoint); a clustered
worker also exits 1 after writing ``error.pb``, where another task exits 0. SIGTERM is aimed
at the attempt while its task waits for it.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flyte._internal.runtime.convert import convert_from_native_to_inputs, convert_outputs_to_native
from flyte._internal.runtime.io import load_outputs
from flyteidl2.core import execution_pb2  # type: ignore[import-untyped]

from flyte_checkpoint.integrations.flyte import PREEMPTED_ERROR_CODE
from tests.faults.signals.processes import running
from tests.integrations.flyte_tasks import count_until_preempted, count_until_preempted_async
from tests.runner_programs import STEPS

RESOLVER = "flyte._internal.resolvers.default.DefaultTaskResolver"
TASK_MODULE = "tests.integrations.flyte_container"
GRACE_SECONDS = "5"


@dataclass
class Attempt:
    """One attempt's locations, as the platform hands them to the container."""

    root: Path
    number: int

    @property
    def checkpoint(self) -> Path:
        return self.root / f"attempt-{self.number}" / "checkpoint"

    @property
    def outputs(self) -> Path:
        return self.root / f"attempt-{self.number}" / "outputs"

    def error(self) -> execution_pb2.ContainerError:
        document = execution_pb2.ErrorDocument()
        document.ParseFromString((self.outputs / "error.pb").read_bytes())
        return document.error

    def result(self, task: Any) -> Any:
        outputs = asyncio.run(load_outputs(str(self.outputs / "outputs.pb")))
        return asyncio.run(convert_outputs_to_native(task.native_interface, outputs))


def run_attempt(
    attempt: Attempt, task: Any, *, signals: int, unhandled: bool = False, previous: Attempt | None = None
) -> str:
    """Run ``task`` as attempt ``attempt.number`` in its own container-entry process; send it
    SIGTERM when it waits for one. Its output."""
    inputs = attempt.root / f"inputs-{attempt.number}.pb"
    converted = asyncio.run(
        convert_from_native_to_inputs(task.native_interface, signals=signals, unhandled=unhandled)
    )
    inputs.write_bytes(converted.proto_inputs.SerializeToString())
    attempt.outputs.mkdir(parents=True)
    argv = [
        "a0",
        *("--inputs", str(inputs), "--outputs-path", str(attempt.outputs), "--version", "test"),
        *("--run-base-dir", str(attempt.root / "run"), "--checkpoint-path", str(attempt.checkpoint)),
        *(("--prev-checkpoint", str(previous.checkpoint)) if previous is not None else ()),
        *("--org", "testorg", "--project", "testproject", "--domain", "development"),
        *("--run-name", "testrun", "--name", "a0"),
        *("--resolver", RESOLVER, "mod", TASK_MODULE, "instance", task.func.__name__),
    ]
    environment = {
        "TORCHELASTIC_RUN_ID": "offline",
        "FLYTE_ATTEMPT_NUMBER": str(attempt.number),
        "FLYTE_CHECKPOINT_GRACE_SECONDS": GRACE_SECONDS,
    }
    with running(argv, module="flyte._bin.runtime", environment=environment) as program:
        if attempt.number < signals:
            program.wait_for_line("ready")
            program.send(signal.SIGTERM)
        program.finish()
        return program.output()


def test_a_preempted_attempt_commits_its_checkpoint_and_ends_with_a_system_error(tmp_path: Path) -> None:
    first = Attempt(tmp_path, 0)
    output = run_attempt(first, count_until_preempted, signals=1)
    assert first.checkpoint.read_bytes() == b"2", output
    error = first.error()
    assert error.code == PREEMPTED_ERROR_CODE
    assert error.origin == execution_pb2.ExecutionError.SYSTEM
    assert error.kind == execution_pb2.ContainerError.RECOVERABLE
    assert "the checkpoint saved after the notice committed" in error.message


def test_the_next_attempt_resumes_from_the_step_the_preempted_one_saved(tmp_path: Path) -> None:
    first, second = Attempt(tmp_path, 0), Attempt(tmp_path, 1)
    run_attempt(first, count_until_preempted, signals=1)
    output = run_attempt(second, count_until_preempted, signals=1, previous=first)
    assert "attempt 1 starts at 2" in output
    assert second.result(count_until_preempted) == STEPS


@pytest.mark.parametrize("task", [count_until_preempted, count_until_preempted_async], ids=["def", "async"])
def test_a_task_that_ignores_the_notice_is_ended_with_the_system_error_once_its_saves_commit(
    tmp_path: Path, task: Any
) -> None:
    first = Attempt(tmp_path, 0)
    output = run_attempt(first, task, signals=1, unhandled=True)
    assert first.checkpoint.read_bytes() == b"2", output
    error = first.error()
    assert error.code == PREEMPTED_ERROR_CODE
    assert error.origin == execution_pb2.ExecutionError.SYSTEM
