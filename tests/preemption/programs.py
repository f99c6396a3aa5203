"""Training loops the preemption tests run as real processes:
``python -m tests.preemption.programs MODE DEST [--grace G] [--signal NAME] [--state-mib N]``.

Each step takes 50 ms; every 20th step is saved in the background. Output, flushed per line:
``resumed N`` (the step restored), ``ready`` (after the first step), ``saving N`` (a background
save of step N was started), ``step N`` (step N is done). Modes:

``one-line``
    the documented loop: save at the notice (blocking) and ``raise checkpoint.preemption()``.
``zero-code``
    never reads ``checkpoint.preempted``: only the handler is installed, as a runner does.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections.abc import Sequence

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.preemption import install_preemption_handler

STEP_SECONDS = 0.05
SAVE_EVERY = 20


def state_of(step: int, extra_mib: int) -> bytes:
    """The step, then ``extra_mib`` MiB of padding (a save long enough to be caught in flight)."""
    return f"{step}\n".encode() + b"\0" * (extra_mib << 20)


def step_of(state: bytes) -> int:
    return int(state.split(b"\n", 1)[0])


def train(mode: str, dest: str, extra_mib: int, steps: int) -> None:
    helper = Checkpoint(dest, dest)
    restored = helper.load_sync()
    step = step_of(restored.read_bytes()) if restored is not None else 0
    print(f"resumed {step}", flush=True)
    while step < steps:
        time.sleep(STEP_SECONDS)
        step += 1
        print(f"step {step}", flush=True)
        if step == 1:
            print("ready", flush=True)
        if mode == "one-line":
            if step % SAVE_EVERY == 0 or helper.preempted:
                helper.save_sync(state_of(step, extra_mib), background=not helper.preempted)
            if helper.preempted:
                raise helper.preemption()
        elif step % SAVE_EVERY == 0:
            helper.save_sync(state_of(step, extra_mib), background=True)
            print(f"saving {step}", flush=True)
    helper.close()
    print("finished", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["one-line", "zero-code"])
    parser.add_argument("dest")
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--signal", default="SIGTERM")
    parser.add_argument("--state-mib", type=int, default=0)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args(argv)
    with install_preemption_handler([signal.Signals[args.signal]], grace_seconds=args.grace):
        train(args.mode, args.dest, args.state_mib, args.steps)


if __name__ == "__main__":
    main()
