"""The preemption benchmark's tables: each preemption, and the summary per configuration."""

from __future__ import annotations

from typing import TextIO

from benchmarks.lib.preemption_calibration import basis_name
from benchmarks.lib.preemption_checks import ratio_text
from benchmarks.lib.preemption_plan import LABELS, PLAIN, SCENARIOS
from benchmarks.lib.preemption_results import ConfigResult, Preemption
from benchmarks.lib.report import print_table


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _in_hand(preemption: Preemption) -> str:
    if preemption.in_flight is not None:
        return str(preemption.in_flight)
    return "-" if preemption.preparing is None else f"(preparing {preemption.preparing})"


def print_preemptions(result: ConfigResult, out: TextIO) -> None:
    config = result.config
    print(
        f"\n{config.name} ({LABELS[config.variant]}"
        + (f", SIGTERM during {SCENARIOS[config.scenario].situation}" if config.scenario != PLAIN else "")
        + f", G = {config.grace_s:.3f} s = "
        f"{config.grace_s / config.save_s:.2f} x the {config.save_s:.3f} s "
        f"{basis_name(config.grace_factor)} calibrated save; the notice keeps "
        f"{config.margin_s:.3f} s of it free to exit, so "
        f"saves must commit within {config.grace_s - config.margin_s:.3f} s of the SIGTERM)",
        file=out,
    )
    rows = [
        [
            f"{p.run}.{p.attempt}",
            f"{p.delay_s:.2f}",
            p.at_sigterm.describe(),
            _in_hand(p),
            str(p.steps_done),
            f"{p.exit} {'at' if p.exit == 'SIGKILL' else 'after'} {p.exit_after_s:.2f} s"
            + (f" ({p.exception})" if p.exception else "")
            + (f"; {p.resumed} committed after it ended" if p.late_commit else ""),
            str(p.resumed),
            p.verdict,
            str(p.steps_lost),
            "yes" if p.committed_in_grace else "no",
            "yes" if p.previous_survived else "no",
            f"{p.wasted_s:.2f}",
        ]
        + (_scenario_cells(p) if config.scenario != PLAIN else [])
        for p in result.preemptions
    ]
    print_table(
        rows,
        [
            "run.attempt",
            "SIGTERM at s",
            "stored at SIGTERM",
            "save in flight",
            "steps done",
            "ended",
            "resumed at",
            "verdict",
            "steps lost",
            "commit in grace",
            "previous kept",
            "wasted s",
        ]
        + (
            [f"during {SCENARIOS[config.scenario].situation}", "called before: kept", "children left"]
            if config.scenario != PLAIN
            else []
        ),
        out,
    )


def _scenario_cells(preemption: Preemption) -> list[str]:
    called = (
        "-"
        if preemption.called is None
        else f"{preemption.called}: {'yes' if preemption.called_kept else 'NO'}"
    )
    return ["yes" if preemption.situation else "no", called, str(preemption.children_left)]


def print_summary(results: list[ConfigResult], out: TextIO) -> None:
    print("\ntotals per configuration", file=out)
    rows = []
    for result in results:
        s = result.summary()
        bad = s["bad"]
        rows.append(
            [
                result.config.name,
                f"{result.config.grace_s:.3f}",
                _fmt(s["blocking_save_s_median"], 3),
                "-"
                if not s["blocking_save_s_median"]
                else f"{result.config.grace_s / s['blocking_save_s_median']:.1f}",
                str(s["preemptions"]),
                f"{s['steps_lost_total']} / {s['steps_lost_max']} / {_fmt(s['steps_lost_mean'], 1)}",
                ratio_text(s["committed_in_grace"], s["preemptions"]),
                f"{s['in_flight_survived']}/{s['in_flight_at_sigterm']}",
                ratio_text(s["previous_survived"], s["preemptions"]),
                f"{bad['corrupt']}/{bad['mixed']}/{bad['unreadable']}",
                f"{s['exited_by_itself']}/{s['preemptions']}",
                str(s["late_commits"]),
                f"{s['wasted_s_total']:.1f} / {_fmt(s['wasted_s_mean'])}",
                _fmt(s["restart_s_median"], 3),
                f"{s['runs_finished']}/{s['runs_started']}",
                f"{s['runs_model_equal']}/{s['runs_finished']}",
                f"{result.wall_s:.0f}",
                result.error or "",
            ]
        )
    print_table(
        rows,
        [
            "configuration",
            "G s",
            "save in grace s",
            "G / save",
            "preemptions",
            "steps lost tot/max/mean",
            "commit in grace",
            "in-flight survived",
            "previous kept",
            "corrupt/mixed/unreadable",
            "exited before SIGKILL",
            "committed after exit",
            "wasted s tot/mean",
            "restart s",
            "runs finished",
            "model equal",
            "wall s",
            "error",
        ],
        out,
    )
