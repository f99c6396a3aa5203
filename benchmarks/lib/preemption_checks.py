"""The preemption benchmark's targets, judged from the configurations' results."""

from __future__ import annotations

import argparse
import functools

from benchmarks.lib.preemption_plan import BAD_VERDICTS, MIN_PREEMPTIONS, PLAIN, SCENARIOS, TARGET_GRACE
from benchmarks.lib.preemption_results import ConfigResult
from benchmarks.lib.targets import Check


def ratio_text(count: int, total: int) -> str:
    return f"{count}/{total}" + (f" ({count / total:.0%})" if total else "")


def evaluate(results: list[ConfigResult], args: argparse.Namespace) -> list[Check]:
    checks: list[Check] = []
    storages = list(dict.fromkeys(r.config.storage for r in results))
    for storage in storages:
        mine = [r for r in results if r.config.storage == storage]
        mine = [r for r in mine if r.config.scenario == PLAIN]
        long = [r for r in mine if r.config.grace_factor >= TARGET_GRACE and r.config.variant != "reference"]
        short = [r for r in mine if r.config.grace_s < r.config.save_s and r.config.variant != "reference"]
        for result in long:
            n = len(result.preemptions)
            if result.config.variant == "oneline":
                worst = max((p.steps_lost for p in result.preemptions), default=0)
                checks.append(
                    Check(
                        f"{result.config.name}: steps lost per preemption",
                        f"max {worst}, total {sum(p.steps_lost for p in result.preemptions)} over {n}",
                        "<= 1",
                        None if not n else worst <= 1 and not result.error,
                    )
                )
                committed = result.count(lambda p: p.committed_in_grace)
                checks.append(
                    Check(
                        f"{result.config.name}: a save committed inside the grace period",
                        ratio_text(committed, n),
                        "100%",
                        None if not n else committed == n and not result.error,
                    )
                )
            elif result.config.variant == "nochange":
                flying = [p for p in result.preemptions if p.in_flight is not None]
                survived = sum(1 for p in flying if p.committed_in_grace)
                checks.append(
                    Check(
                        f"{result.config.name}: the in-flight background save survives",
                        f"{ratio_text(survived, len(flying))} with a save in flight, of {n}",
                        "100%",
                        None if not flying else survived == len(flying) and not result.error,
                    )
                )
        for result in short:
            n = len(result.preemptions)
            survived = result.count(lambda p: p.previous_survived)
            checks.append(
                Check(
                    f"{result.config.name} (G < one save): the previous checkpoint survives",
                    ratio_text(survived, n),
                    "100%",
                    None if not n else survived == n and not result.error,
                )
            )
            finished = sum(1 for r in result.runs if r.finished)
            stall = max((r.longest_stall for r in result.runs), default=0)
            checks.append(
                Check(
                    f"{result.config.name} (G < one save): every run finishes",
                    f"{finished}/{len(result.runs)} runs; at most {stall} attempts in a row not progressing",
                    "all runs",
                    None if not result.runs else finished == len(result.runs) and not result.error,
                )
            )
        ours = [r for r in mine if r.config.variant != "reference" and r.config.scenario == PLAIN]
        if ours:
            bad = sum(r.count(lambda p: p.verdict in BAD_VERDICTS) for r in ours)
            total = sum(len(r.preemptions) for r in ours)
            fewest = min(len(r.preemptions) for r in ours)
            checks.append(
                Check(
                    f"{storage}: corrupt, mixed or unreadable checkpoints (ours)",
                    f"{bad} over {total} preemptions in {len(ours)} configurations (fewest {fewest})",
                    f"0, >= {MIN_PREEMPTIONS} per configuration",
                    bad == 0 and fewest >= MIN_PREEMPTIONS and not any(r.error for r in ours),
                )
            )
            runs = [run for r in ours for run in r.runs if run.finished]
            equal = sum(1 for run in runs if run.model_matches)
            checks.append(
                Check(
                    f"{storage}: finished runs' final model bit-equal to an uninterrupted run (ours)",
                    ratio_text(equal, len(runs)),
                    "100%",
                    None if not runs else equal == len(runs),
                )
            )
    return checks


def _judged(failed: bool, ok: bool, cases: int) -> bool | None:
    """A target's verdict: not met when the configuration failed, nothing to judge without cases."""
    return False if failed else (None if not cases else ok)


def evaluate_scenarios(results: list[ConfigResult]) -> list[Check]:
    """Issue 29's targets on each scenario's configurations: 0 hangs; 0 SIGKILLs, at most one
    step lost from the first save on and every save called before the notice kept, when G is at
    least twice the slowest save; 0 corrupt; and the SIGTERM landed where the scenario means it
    to at least once (a scenario that never met its case proved nothing)."""
    checks: list[Check] = []
    for result in results:
        config = result.config
        if config.scenario == PLAIN:
            continue
        scenario = SCENARIOS[config.scenario]
        name, n = config.name, len(result.preemptions)
        judged = functools.partial(_judged, result.error is not None)

        hangs = result.count(lambda p: p.hang)
        checks.append(Check(f"{name}: hangs", f"{hangs} over {n} preemptions", "0", judged(hangs == 0, n)))
        if config.grace_factor >= TARGET_GRACE:
            late = [p for p in result.preemptions if p.late]
            children = sum(1 for p in late if p.exit.endswith("children past G"))
            checks.append(
                Check(
                    f"{name}: SIGKILLs (G = {config.grace_s:.2f} s >= 2x the slowest save)",
                    f"{len(late)} over {n}"
                    + (f" ({children}: its fork children outlived G)" if children else ""),
                    "0",
                    judged(not late, n),
                )
            )
            # From the first save on: a preemption before anything was saved or called has
            # nothing to lose but the steps it trained.
            counted = [p for p in result.preemptions if p.at_sigterm.status != "none" or p.called is not None]
            worst = max((p.steps_lost for p in counted), default=0)
            checks.append(
                Check(
                    f"{name}: steps lost per preemption, from the first save on",
                    f"max {worst}, total {sum(p.steps_lost for p in counted)} over {len(counted)}",
                    "<= 1",
                    judged(worst <= 1, len(counted)),
                )
            )
            called = [p for p in result.preemptions if p.called is not None]
            kept = sum(1 for p in called if p.called_kept)
            checks.append(
                Check(
                    f"{name}: saves called before the notice kept",
                    f"{ratio_text(kept, len(called))} with a save called and not yet stored",
                    "100%",
                    judged(kept == len(called), len(called)),
                )
            )
        bad = result.count(lambda p: p.verdict in BAD_VERDICTS)
        checks.append(
            Check(
                f"{name}: corrupt, mixed or unreadable checkpoints",
                f"{bad} over {n}",
                "0",
                judged(bad == 0, n),
            )
        )
        landed = result.count(lambda p: bool(p.situation))
        checks.append(
            Check(
                f"{name}: SIGTERMs during {scenario.situation}",
                ratio_text(landed, n),
                ">= 1",
                judged(landed >= 1, n),
            )
        )
    return checks
