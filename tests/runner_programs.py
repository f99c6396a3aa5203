"""A counting task and the runners around it, as real processes a test aims SIGTERM at.

``python -m tests.runner_programs DIR [--signals K] [--preemption-retries P] [--async] [--unhandled]
[--user-handler] [--once]`` runs :func:`count` (or :func:`count_async`) under ``run_with_retries``
(or ``run_with_retries_async``; ``--once``: one attempt, ``load_and_run_task``) with ``retries=0``
and a 5 s grace period, checkpointing in DIR.
Attempts ``0 .. K-1`` print ``ready`` and wait for the parent's SIGTERM; ``--unhandled`` tasks
never read ``checkpoint.preempted`` (the handler ends them); ``--user-handler`` installs a
SIGTERM handler of its own before the runner. The last line is JSON: the result, or the
``Preempted`` that ended the run, and what became of the user's handler.

:func:`count` is also the task ``flyte-checkpoint run`` and ``load_and_run_task`` are given.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from flyte_checkpoint import (
    Checkpoint,
    CheckpointPaths,
    ctx,
    load_and_run_task,
    run_with_retries,
    run_with_retries_async,
)
from flyte_checkpoint.errors import Preempted

STEP_SECONDS = 0.05
STEPS = 6
GRACE_SECONDS = 5.0
WAIT_FOR_SIGNAL_SECONDS = 20.0
"""How long a signalled attempt waits for the parent's SIGTERM before it goes on regardless."""


def _attempt() -> tuple[int, Checkpoint]:
    context = ctx()
    assert context is not None
    checkpoint = context.checkpoint
    assert checkpoint is not None
    return context.attempt_number, checkpoint


class Counting:
    """One attempt's count: where it starts, and its wait at step 2 for the parent's SIGTERM."""

    def __init__(self, number: int, restored: bytes | None, signals: int) -> None:
        self.step = int(restored) if restored else 0
        print(f"attempt {number} starts at {self.step}", flush=True)
        self._waits = number < signals
        self._give_up: float | None = None

    def advance(self) -> None:
        """One step further, unless this attempt waits for its SIGTERM (then it prints ``ready``)."""
        if self._waits and self.step == 2:
            if self._give_up is None:
                print("ready", flush=True)
                self._give_up = time.monotonic() + WAIT_FOR_SIGNAL_SECONDS
            if time.monotonic() < self._give_up:
                return
        self.step += 1


def count(
    signals: int = 1,
    unhandled: bool = False,
    save_on_notice: bool = True,
    in_background: bool = False,
    linger_at_exit: bool = False,
    own_handler: bool = False,
) -> int:
    """Count to :data:`STEPS` in 50 ms steps; attempts below ``signals`` stop at step 2 to wait
    for SIGTERM. Handled (the documented loop): save on the notice, then stop with
    ``checkpoint.preemption()``; ``in_background``: that save goes to the background, as in the
    documented loop when the notice comes while the state is written. ``unhandled``: save after
    every step and never look. ``linger_at_exit``: the interpreter's exit prints ``exiting`` and
    takes 2 s (as one waiting for a save or flushing logs does). ``own_handler``: the task
    installs a SIGTERM handler of its own (printing ``task handler``) over the runner's."""
    if linger_at_exit:
        atexit.register(_linger)
    if own_handler:
        signal.signal(signal.SIGTERM, lambda signum, frame: print("task handler", flush=True))
    number, checkpoint = _attempt()
    restored = checkpoint.load_sync()
    counting = Counting(number, None if restored is None else restored.read_bytes(), signals)
    while counting.step < STEPS:
        time.sleep(STEP_SECONDS)
        counting.advance()
        if unhandled:
            checkpoint.save_sync(str(counting.step).encode())
        elif checkpoint.preempted:
            if save_on_notice:
                checkpoint.save_sync(str(counting.step).encode(), background=in_background)
                print(f"saved {counting.step}", flush=True)
            raise checkpoint.preemption()
    return counting.step


def _linger() -> None:
    print("exiting", flush=True)
    time.sleep(2)


def save_slowly_on_notice(linger_seconds: float = 0.0, state_mib: int = 40) -> None:
    """Print ``ready``, wait for the notice, then save a directory whose upload takes 0.1 s per
    MiB (longer than the grace period): the save deadline refuses it. The exit then takes
    ``linger_seconds`` in an atexit hook (printing ``exiting``): a slow but real exit path."""
    if linger_seconds:
        atexit.register(time.sleep, linger_seconds)
        atexit.register(print, "exiting", flush=True)  # atexit runs last in, first out
    _, checkpoint = _attempt()
    state = Path(tempfile.mkdtemp(prefix="slow-state-"))
    atexit.register(shutil.rmtree, state, ignore_errors=True)
    for index in range(state_mib):
        (state / f"shard-{index}.bin").write_bytes(os.urandom(1 << 20))
    print("ready", flush=True)
    give_up = time.monotonic() + WAIT_FOR_SIGNAL_SECONDS
    while not checkpoint.preempted and time.monotonic() < give_up:
        time.sleep(STEP_SECONDS)
    checkpoint.save_sync(state, progress=lambda done, total: time.sleep(0.1))
    raise checkpoint.preemption()


def save_then_wait_for_ctrl_c(background: bool = False, save: bool = True) -> None:
    """Save ``7`` (in the ``background``; nothing without ``save``), print ``ready`` and wait for
    a Ctrl-C (SIGINT)."""
    # As in an interactive shell: a job started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _, checkpoint = _attempt()
    if save:
        checkpoint.save_sync(b"7", background=background)
    print("ready", flush=True)
    time.sleep(WAIT_FOR_SIGNAL_SECONDS)


def previous_location() -> str | None:
    """Where this attempt's checkpoint restores from, after the previous-attempt URI repair."""
    _, checkpoint = _attempt()
    return checkpoint.remote_source


async def count_async(signals: int = 1, unhandled: bool = False) -> int:
    """:func:`count` as an ``async def`` task."""
    number, checkpoint = _attempt()
    restored = await checkpoint.load()
    counting = Counting(number, None if restored is None else restored.read_bytes(), signals)
    while counting.step < STEPS:
        await asyncio.sleep(STEP_SECONDS)
        counting.advance()
        if unhandled:
            await checkpoint.save(str(counting.step).encode())
        elif checkpoint.preempted:
            await checkpoint.save(str(counting.step).encode())
            print(f"saved {counting.step}", flush=True)
            raise checkpoint.preemption()
    return counting.step


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--signals", type=int, default=1)
    parser.add_argument("--preemption-retries", type=int, default=10)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--unhandled", action="store_true")
    parser.add_argument("--user-handler", action="store_true")
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)

    calls: list[int] = []

    def user_handler(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    if args.user_handler:
        signal.signal(signal.SIGTERM, user_handler)
    options: dict[str, Any] = {
        "signals": args.signals,
        "unhandled": args.unhandled,
        "retries": 0,
        "preemption_retries": args.preemption_retries,
        "checkpoint_dir": args.checkpoint_dir,
        "grace_seconds": GRACE_SECONDS,
    }
    outcome: dict[str, Any] = {}
    try:
        if args.once:
            paths = CheckpointPaths(checkpoint_path=f"{args.checkpoint_dir}/checkpoint")
            inputs = {"signals": args.signals, "unhandled": args.unhandled}
            outcome["result"] = load_and_run_task(
                count, checkpoint_paths=paths, inputs=inputs, grace_seconds=GRACE_SECONDS
            )
        elif args.use_async:
            outcome["result"] = asyncio.run(run_with_retries_async(count_async, **options))
        else:
            outcome["result"] = run_with_retries(count, **options)
    except Preempted as preempted:
        outcome["preempted"] = {"saved": preempted.saved, "code": preempted.code}
    outcome["user_handler_calls"] = len(calls)
    outcome["user_handler_restored"] = signal.getsignal(signal.SIGTERM) is user_handler
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()


def swallow_the_first_ending(seconds: float = 20.0) -> None:
    """Never reads the notice, and swallows the first ``Preempted`` raised into it, as C code
    that clears every pending exception does (torch's import of numpy): then runs on."""
    print("ready", flush=True)
    try:
        time.sleep(seconds)
    except BaseException:  # what the C code does, on purpose
        print("swallowed", flush=True)
    time.sleep(seconds)
