"""Real Flyte tasks for the plugin tests, and a helper that runs one in the SDK's local mode."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any, cast

import flyte

import flyte_checkpoint
import flyte_checkpoint.integrations.flyte as flyte_plugin
from flyte_checkpoint.preemption import handler
from tests import runner_programs
from tests.integrations.examples import load_example

# Where the SDK's local mode writes run metadata; it has no option to move it.
SDK_LOCAL_METADATA = Path("/tmp/flyte/metadata")

env = flyte.TaskEnvironment(name="flyte_checkpoint_tests")


class PlannedFailure(RuntimeError):
    """The failure these tasks raise on purpose, to make the SDK retry them."""


def run_locally(raw_data: Path, task: Any, **inputs: Any) -> Any:
    """Run ``task`` in the SDK's local mode with its raw data under ``raw_data``; return its output.

    The checkpoint object lands at ``raw_data / "checkpoint"`` and the SDK stages it at
    ``raw_data / "prev_checkpoint"`` before each retry.
    """
    name = f"fc-{uuid.uuid4().hex[:16]}"
    try:
        run = flyte.with_runcontext(mode="local", name=name, raw_data_path=str(raw_data)).run(task, **inputs)
        return run.outputs()[0]
    finally:
        shutil.rmtree(SDK_LOCAL_METADATA / name, ignore_errors=True)


def _log_start(log: str, start: int) -> None:
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"{start}\n")


def starts_logged(log: Path) -> list[int]:
    """The starting points the attempts of a counting task wrote to ``log``, in order."""
    return [int(line) for line in log.read_text(encoding="utf-8").split()]


@env.task
def describe_checkpoint() -> str:
    """What ``flyte.ctx().checkpoint`` is inside a task, as JSON."""
    context = flyte.ctx()
    assert context is not None
    checkpoint = context.checkpoint
    return json.dumps(
        {
            "type": f"{type(checkpoint).__module__}.{type(checkpoint).__qualname__}",
            "same_on_second_access": checkpoint is context.checkpoint,
            "destination": getattr(checkpoint, "remote_destination", None),
            "source": getattr(checkpoint, "remote_source", None),
            "fsync": getattr(getattr(checkpoint, "_dest_backend", None), "fsync", None),
        }
    )


@env.task
def describe_bridged_context() -> str:
    """What ``flyte_checkpoint.ctx()`` sees inside a Flyte task, as JSON."""
    ours = flyte_checkpoint.ctx()
    sdk = flyte.ctx()
    assert sdk is not None
    if ours is None:
        return json.dumps(None)
    return json.dumps(
        {
            "shares_helper": cast(object, ours.checkpoint) is sdk.checkpoint,
            "run_name": ours.run_name,
            "sdk_run_name": sdk.action.run_name,
            "action_name": ours.action_name,
            "sdk_action_name": sdk.action.name,
        }
    )


@env.task(retries=3)
def count_sync(n: int, fail_every: int, log: str) -> int:
    """Count to ``n``, saving after each step as bytes, failing at each multiple of ``fail_every``."""
    context = flyte.ctx()
    assert context is not None
    checkpoint = context.checkpoint
    assert checkpoint is not None
    restored = checkpoint.load_sync()
    start = int(restored.read_bytes()) if restored is not None else 0
    _log_start(log, start)
    for value in range(start, n):
        if value > start and value % fail_every == 0:
            raise PlannedFailure(f"planned failure at {value}")
        checkpoint.save_sync(str(value + 1).encode())
    return n


@env.task(retries=3)
async def count_async(n: int, fail_every: int, log: str) -> int:
    """:func:`count_sync` as an ``async def`` task: the same state, awaited."""
    context = flyte.ctx()
    assert context is not None
    checkpoint = context.checkpoint
    assert checkpoint is not None
    restored = await checkpoint.load()
    start = int(restored.read_bytes()) if restored is not None else 0
    _log_start(log, start)
    for value in range(start, n):
        if value > start and value % fail_every == 0:
            raise PlannedFailure(f"planned failure at {value}")
        await checkpoint.save(str(value + 1).encode())
    return n


@env.task(retries=2)
def grow_directory(n: int, fail_at: int, workdir: str, log: str) -> int:
    """Add one file per step to a directory saved whole after each step; fail once at ``fail_at``."""
    context = flyte.ctx()
    assert context is not None
    checkpoint = context.checkpoint
    assert checkpoint is not None
    restored = checkpoint.load_sync()
    state = Path(workdir)
    shutil.rmtree(state, ignore_errors=True)
    if restored is not None:
        shutil.copytree(restored, state)
    else:
        state.mkdir(parents=True)
    start = len(list(state.glob("step-*.txt")))
    _log_start(log, start)
    for step in range(start, n):
        if step == fail_at and start < fail_at:
            raise PlannedFailure(f"planned failure at step {step}")
        (state / f"step-{step}.txt").write_text(f"step {step}\n", encoding="utf-8")
        checkpoint.save_sync(state)
    return len(list(state.glob("step-*.txt")))


@env.task(retries=2)
def fail_on_the_first_attempt(log: str) -> int:
    """Fail on attempt 0 only, judged by ``flyte_checkpoint.ctx().attempt_number``, as the examples do."""
    context = flyte_checkpoint.ctx()
    assert context is not None
    _log_start(log, context.attempt_number)
    if context.attempt_number == 0:
        raise PlannedFailure("planned failure on the first attempt")
    return context.attempt_number


@env.task
def describe_preemption_handler() -> str:
    """Whether the preemption handler is installed while the task runs, as JSON."""
    return json.dumps(handler.is_installed())


@env.task
def describe_typed_accessor() -> str:
    """What ``flyte_checkpoint.integrations.flyte.checkpoint()`` returns inside a task, as JSON."""
    ours = flyte_plugin.checkpoint()
    sdk = flyte.ctx()
    assert sdk is not None
    return json.dumps(
        {
            "type": f"{type(ours).__module__}.{type(ours).__qualname__}",
            "same_as_flyte_ctx": cast(object, ours) is sdk.checkpoint,
            "same_as_ctx": (context := flyte_checkpoint.ctx()) is not None and context.checkpoint is ours,
        }
    )


@env.task(retries=1)
async def train_the_pytorch_example(epochs: int, fail_at_epoch: int, workdir: str, log: str) -> int:
    """``examples/pytorch_resume.py``'s task, unchanged: it crashes on attempt 0 only, then resumes."""
    example = load_example("pytorch_resume")
    return int(
        await example.train(epochs, fail_at_epoch, workdir, on_start=lambda start, *_: _log_start(log, start))
    )


@env.task
def count_until_preempted(signals: int, unhandled: bool) -> int:
    """``tests.runner_programs.count`` as a Flyte task: attempts below ``signals`` wait at step 2
    for SIGTERM; handled, they save on the notice and raise ``checkpoint.preemption()``."""
    return runner_programs.count(signals=signals, unhandled=unhandled)


@env.task
async def count_until_preempted_async(signals: int, unhandled: bool) -> int:
    """:func:`count_until_preempted` as an ``async def`` task."""
    return await runner_programs.count_async(signals=signals, unhandled=unhandled)
