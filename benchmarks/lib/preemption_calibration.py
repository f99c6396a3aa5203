"""Calibration of the save's duration, the uninterrupted baseline and the configurations G is set from."""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import _preemption_trainer as trainer  # stdlib-only at module level
from benchmarks.lib.attempts import Processes
from benchmarks.lib.preemption_plan import (
    CALIBRATION_GRACE_S,
    CALIBRATION_ROUNDS,
    HERE,
    PLAIN,
    START_TIMEOUT_S,
    VARIANTS,
    Config,
    Scale,
)
from benchmarks.lib.preemption_stores import Store
from benchmarks.lib.supervisor import Supervisor


def calibrate(
    processes: Processes, store: Store, scale: Scale, work: Path, variant: str, saves: int
) -> list[float]:
    """Durations of blocking saves (the state directory written, then saved) on ``store``."""
    spec = processes.spec(
        work / f"calibrate-{store.name}-{variant}",
        variant=variant,
        dest=store.uri(f"calibrate-{variant}/checkpoint"),
        storage_options=store.storage_options,
        env=dict(store.env),
        extra_mib=scale.extra_mib,
        saves=saves,
    )
    events = processes.run_to_end(trainer.calibrate, spec, START_TIMEOUT_S + 60 * saves)
    found = next(event for event in events if event["e"] == "calibrated")
    durations: list[float] = found["durations"]
    return durations


@dataclass
class InRun:
    """The final saves a calibration run timed, and how its attempts ended."""

    durations: list[float]
    endings: dict[str, int]
    """Per exception the job ended with (``Preempted`` for the documented loop), how many."""


def calibrate_in_run(
    store: Store,
    scale: Scale,
    processes: Processes,
    work: Path,
    digest: str,
    args: argparse.Namespace,
    scenario: str = PLAIN,
    label: str = "calibration",
    rounds: int = CALIBRATION_ROUNDS,
    saves: int | None = None,
) -> InRun:
    """Durations of ours' final save after a notice, met in the run itself: what G is a multiple of.

    The one-line job preempted at random instants, with a grace period no save comes near, so
    every final save runs to its end. Saves back to back (:func:`calibrate`) were 7-130% quicker
    than these: in the run the job's state is written right after a training step, often with a
    background save of the previous state still in flight, and the page cache holds the saves
    before. G computed from those would be under twice the save the configurations meet.
    A plain job that never completes a final save is a harness failure; a scenario's is a
    finding, returned with how its attempts ended.
    """
    found = InRun([], {})
    saves = args.calibration_saves if saves is None else saves
    # A notice that comes while the state is being written finds that step's save already sent
    # to the background (the documented loop), so that preemption has no blocking final save:
    # further rounds until there are ``--calibration-saves`` of them.
    for round_ in range(rounds):
        config = Config(
            store.name,
            "oneline",
            label if not round_ else f"{label}-{round_ + 1}",
            0.0,
            CALIBRATION_GRACE_S,
            0.0,
            scenario,
        )
        wanted = saves - len(found.durations)
        supervisor = Supervisor(config, scale, store, processes, work, wanted, digest, args.seed)
        result = supervisor.run()
        if result.error:
            raise RuntimeError(f"calibrating the save in the run of {config.name} failed: {result.error}")
        found.durations += result.blocking_saves_s
        for preemption in result.preemptions:
            ending = preemption.exception or preemption.exit
            found.endings[ending] = found.endings.get(ending, 0) + 1
        if len(found.durations) >= saves:
            break
    if not found.durations and scenario == PLAIN:
        raise RuntimeError(
            f"calibrating the save in the run on {store.name}: no final save after a notice in "
            f"{rounds} rounds (every notice came while the state was being written)"
        )
    return found


def baseline_digest(processes: Processes, scale: Scale, work: Path) -> str:
    directory = work / f"baseline-{scale.run_steps}"
    if (directory / "events.jsonl").exists():  # another configuration's run of the same length
        done = [event for event in trainer.read_events(directory / "events.jsonl") if event["e"] == "done"]
        if done:
            return str(done[0]["model_digest"])
    spec = processes.spec(directory, total_steps=scale.run_steps)
    events = processes.run_to_end(trainer.baseline, spec, START_TIMEOUT_S)
    digest: str = next(event for event in events if event["e"] == "done")["model_digest"]
    return digest


def basis_name(factor: float) -> str:
    """Which calibrated save G is ``factor`` times: see :func:`grace_basis`."""
    return "slowest" if factor >= 1 else "quickest"


def grace_basis(in_run: Sequence[float], factor: float) -> float:
    """The save G is a multiple of: the slowest calibrated save for "at least N saves" (N >= 1),
    the quickest for "shorter than one save", so each condition holds for every save measured.

    The save's duration is not one number: on this VM the job's own state write after a notice
    took from one to two times its median. A G of twice the median is under twice the save in
    the preemptions that meet a slow write, and a user sets the grace period from the slowest
    save seen, not the typical one.
    """
    return max(in_run) if basis_name(factor) == "slowest" else min(in_run)


def configurations(
    storage: str, scenario: str, in_run: Sequence[float], scale: Scale, args: argparse.Namespace
) -> list[Config]:
    """The configurations of ``storage`` (plain: every variant; a scenario: the one-line job)
    that ``--only`` selects; with no calibrated saves yet (``in_run`` empty), G is left 0."""
    configs = []
    variants = VARIANTS if scenario == PLAIN else ("oneline",)
    for variant in variants:
        # The reference dies at SIGTERM (no handler), so G cannot change its outcome: one run.
        graces = [args.grace[0]] if variant == "reference" else args.grace
        if scenario != PLAIN:
            graces = args.scenario_grace
        for grace in graces:
            save_s = grace_basis(in_run, grace.factor) if in_run else 0.0
            # The step under way when the notice comes: a long C call's included.
            seconds = grace.seconds(save_s, scale.longest_step_s)
            configs.append(Config(storage, variant, grace.label, grace.factor, seconds, save_s, scenario))
    return [c for c in configs if any(fnmatch.fnmatch(c.name, pattern) for pattern in args.only)]


def cold_start_s() -> float:
    """What a restart would cost without the fork server: a fresh interpreter importing it all."""
    code = "import " + ", ".join(m for m in trainer.PRELOAD if m != trainer.__name__)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, cwd=str(HERE))
    return time.monotonic() - started
