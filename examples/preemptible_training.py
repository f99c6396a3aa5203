"""Example: a training loop that survives preemption with one line, and resumes at the step it saved.

Run it with ``python examples/preemptible_training.py``. A stand-in for the kubelet sends this
process SIGTERM part-way through each of the first attempts, as Kubernetes does to a pod on a
reclaimed spot node (SIGKILL follows ``--grace`` seconds later). The task saves in the background
every ``--save-every`` steps; on the notice it saves the current step at once, bounded by the
time left, and stops with ``raise checkpoint.preemption()``. The runner retries a preempted attempt
on its own budget (``preemption_retries``), never the user's ``retries``, and the next attempt
resumes at exactly the step the notice saved: no step is lost.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
import time

from flyte_checkpoint import ctx, current_checkpoint, run_with_retries


def kubelet(after_seconds: float) -> None:
    """Send this process SIGTERM ``after_seconds`` from now, as a node drain would."""
    timer = threading.Timer(after_seconds, os.kill, args=(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()


def train(steps: int, save_every: int, step_seconds: float, preempt_attempts: int) -> int:
    checkpoint = current_checkpoint()
    attempt = ctx().attempt_number  # type: ignore[union-attr]  # inside a task, ctx() is set
    restored = checkpoint.load_sync()
    step = int(restored.read_bytes()) if restored is not None else 0
    print(
        f"attempt {attempt}: " + (f"resumed at step {step}" if restored else "starting at step 0"), flush=True
    )
    if attempt < preempt_attempts:
        kubelet(after_seconds=(steps // (preempt_attempts + 1)) * step_seconds)
    while step < steps:
        time.sleep(step_seconds)  # the training step
        step += 1
        if checkpoint.preempted:
            checkpoint.hold_background_save()  # the older upload waits for the final save
        if step % save_every == 0 or checkpoint.preempted:  # the one line (and its save)
            checkpoint.save_sync(str(step).encode(), background=not checkpoint.preempted)
        if checkpoint.preempted:
            print(f"attempt {attempt}: preempted after step {step}, saved it", flush=True)
            raise checkpoint.preemption()
    checkpoint.wait_sync()
    print(f"attempt {attempt}: finished all {steps} steps", flush=True)
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=25, help="background save every this many steps")
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--preemptions", type=int, default=2, help="how many attempts are preempted")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="preemptible-") as checkpoints:
        result = run_with_retries(
            train,
            args.steps,
            args.save_every,
            args.step_seconds,
            args.preemptions,
            retries=0,  # no user failures allowed: preemptions have their own budget
            checkpoint_dir=checkpoints,
            grace_seconds=args.grace,
        )
    print(f"result: {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
