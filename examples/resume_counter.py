"""Demo: a task that counts to N, fails on purpose every few steps, and resumes from its checkpoint.

Run it with ``python examples/resume_counter.py`` (options: ``--help``). Checkpoints go to
``./flyte-checkpoints/<run id>/`` by default; pass ``--storage s3://bucket/prefix`` (or any storage
URI) to keep them elsewhere.
"""

from __future__ import annotations

import argparse
import logging
import time
import uuid
from pathlib import Path

from flyte_checkpoint import ctx, run_with_retries


class PlannedFailure(RuntimeError):
    """The failure this demo injects to show a retry resuming."""


def count_to(n: int, fail_every: int, step_seconds: float = 0.0) -> int:
    """Count from the last checkpoint to ``n``, saving after each step and failing every ``fail_every``."""
    context = ctx()
    checkpoint = context.checkpoint if context is not None else None
    if context is None or checkpoint is None:
        raise RuntimeError("count_to runs inside a task: call it through run_with_retries")

    restored = checkpoint.load_sync()
    start = int(restored.read_bytes().decode()) if restored is not None else 0
    print(
        f"attempt {context.attempt_number}: "
        + (f"resumed from checkpoint at {start}" if restored is not None else "no checkpoint, starting at 0"),
        flush=True,
    )
    for value in range(start, n):
        if value > start and value % fail_every == 0:
            print(f"attempt {context.attempt_number}: failing on purpose at {value}", flush=True)
            raise PlannedFailure(f"planned failure at {value}")
        time.sleep(step_seconds)
        checkpoint.save_sync(str(value + 1).encode())
    print(f"attempt {context.attempt_number}: reached {n}", flush=True)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=20, help="count to this number (default 20)")
    parser.add_argument("--fail-every", type=int, default=6, help="fail at every multiple of this")
    parser.add_argument("--retries", type=int, default=None, help="retries (default: just enough)")
    parser.add_argument("--storage", default=None, help="where checkpoints go (default ./flyte-checkpoints)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pause per step, to watch it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    retries = args.retries if args.retries is not None else args.n // args.fail_every + 1
    run_id = uuid.uuid4().hex[:12]
    base = args.storage.rstrip("/") if args.storage else str(Path("flyte-checkpoints").absolute())
    checkpoint_dir = f"{base}/{run_id}"
    print(f"counting to {args.n}, failing every {args.fail_every}, up to {retries} retries")
    print(f"checkpoints: {checkpoint_dir}")
    result = run_with_retries(
        count_to, args.n, args.fail_every, args.step_seconds, retries=retries, checkpoint_dir=checkpoint_dir
    )
    print(f"result: {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
