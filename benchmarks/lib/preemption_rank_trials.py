"""The multi-rank trials (``preemption_ranks.py``) run from the preemption benchmark, and their checks."""

from __future__ import annotations

import argparse
import importlib
from typing import Any, TextIO

from benchmarks.lib.preemption_plan import HERE
from benchmarks.lib.report import log
from benchmarks.lib.targets import Check

RANK_GRACE_S = 30.0
"""The rank trials' grace period (``preemption_ranks.run``'s default): a rank still running
this long after the SIGTERM would have been SIGKILLed."""


def run_ranks(args: argparse.Namespace, out: TextIO) -> dict[str, Any] | None:
    """4 gloo ranks (``preemption_ranks.py``), when that module exists: SIGTERM to one random
    rank, and to every rank at once as under ``torchrun`` (its agent forwards the kubelet's).

    ``run(trials)`` returns one result per trial: the step each rank saved, whether all exited
    and when, their statuses, the step committed. Issue 29's targets on each: no hang (every
    rank exited), no rank still running at G, every rank saved the same step, and that step is
    the one committed (nothing lost from the agreed stop, nothing half-written).
    """
    if not (HERE / "preemption_ranks.py").exists():
        return None
    trials_each = 1 if args.quick else 5
    report: dict[str, Any] = {}
    checks: list[Check] = []
    try:
        module = importlib.import_module("preemption_ranks")
        for mode, signal_all in (("one rank", False), ("every rank (torchrun)", True)):
            print(f"\n4 ranks, SIGTERM to {mode} (preemption_ranks.py)", file=out)
            trials: list[dict[str, Any]] = module.run(
                trials_each, seed=args.seed, grace_seconds=RANK_GRACE_S, signal_all=signal_all
            )
            print(module.format_table(trials), file=out)
            report["all" if signal_all else "one"] = trials
            checks += _rank_checks(f"ranks, SIGTERM to {mode}", trials)
    except Exception as exc:
        log(f"preemption_ranks.py failed: {type(exc).__name__}: {exc}")
        report["error"] = f"{type(exc).__name__}: {exc}"
        checks.append(Check("ranks: preemption_ranks.py ran", report["error"], "runs", False))
    return {"report": report, "checks": checks}


def _rank_checks(name: str, trials: list[dict[str, Any]]) -> list[Check]:
    n = len(trials)
    hung = sum(1 for t in trials if not t["all_exited"])
    late = sum(1 for t in trials if t["seconds_to_exit"] is None or t["seconds_to_exit"] > RANK_GRACE_S)
    same = sum(
        1
        for t in trials
        if len(set(t["saved_steps"].values())) == 1 and None not in t["saved_steps"].values()
    )
    committed = sum(
        1
        for t in trials
        if t["committed_step"] is not None and t["committed_step"] == t["saved_steps"].get(0)
    )
    return [
        Check(f"{name}: hangs (a rank never exited)", f"{hung} over {n} trials", "0", hung == 0),
        Check(
            f"{name}: SIGKILLs (a rank still running at G = {RANK_GRACE_S:g} s)",
            f"{late} over {n}",
            "0",
            late == 0,
        ),
        Check(f"{name}: every rank saved the same step", f"{same}/{n}", "all trials", same == n),
        Check(
            f"{name}: that step committed (none lost, none corrupt)",
            f"{committed}/{n}",
            "all trials",
            committed == n,
        ),
    ]
