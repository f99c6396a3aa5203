"""Example: a Flyte task whose retries resume from a ``flyte_checkpoint`` checkpoint.

Run it with ``python examples/flyte_task.py`` (needs ``pip install '.[flyte]'``).
It runs in the Flyte SDK's local mode, offline: the task counts to N, saving after each step,
and fails on purpose every few steps; the SDK retries it (``retries=``), copying the last
checkpoint to ``prev_checkpoint`` before each retry, and every attempt resumes where the last one
stopped, printing its attempt number (0, 1, 2, ... in local mode too, where the SDK itself reports
0 for every retry). The only line that makes ``flyte.ctx().checkpoint`` and
``flyte_checkpoint.ctx()`` use ``flyte_checkpoint`` is
``flyte_checkpoint.integrations.flyte.install()``. On a cluster the same code runs remotely.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid

import flyte

import flyte_checkpoint
import flyte_checkpoint.integrations.flyte

flyte_checkpoint.integrations.flyte.install()

env = flyte.TaskEnvironment(name="flyte_checkpoint_example")


class PlannedFailure(RuntimeError):
    """The failure this example injects to show a retry resuming."""


@env.task(retries=4)
def count_to(n: int, fail_every: int) -> int:
    """Count from the last checkpoint to ``n``, saving each step, failing at every ``fail_every``."""
    # The same helper as flyte.ctx().checkpoint, typed as a flyte_checkpoint.Checkpoint.
    checkpoint = flyte_checkpoint.integrations.flyte.checkpoint()
    context = flyte_checkpoint.ctx()  # this Flyte task, seen through flyte_checkpoint
    assert checkpoint is not None
    assert context is not None
    attempt = context.attempt_number
    restored = checkpoint.load_sync()  # None on the first attempt
    start = int(restored.read_bytes()) if restored is not None else 0
    print(
        f"attempt {attempt}: resumed from checkpoint at",
        start if restored is not None else "nothing: starting at 0",
        flush=True,
    )
    for value in range(start, n):
        if value > start and value % fail_every == 0:
            print(f"attempt {attempt}: failing on purpose at {value}", flush=True)
            raise PlannedFailure(f"planned failure at {value}")
        checkpoint.save_sync(str(value + 1).encode())
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=10, help="count to this number (default 10)")
    parser.add_argument("--fail-every", type=int, default=4, help="fail at every multiple of this")
    parser.add_argument("--run-name", default=None, help="the local run's name (default: random)")
    args = parser.parse_args(argv)
    flyte.init()
    with tempfile.TemporaryDirectory(prefix="flyte-task-example-") as raw_data:
        run = flyte.with_runcontext(
            mode="local", name=args.run_name or f"fc-example-{uuid.uuid4().hex[:8]}", raw_data_path=raw_data
        ).run(count_to, n=args.n, fail_every=args.fail_every)
        print(f"result: {run.outputs()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
