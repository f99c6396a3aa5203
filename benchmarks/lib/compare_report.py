"""The compare benchmark's report: the tables of measurements, physical baselines and targets."""

from __future__ import annotations

from typing import Any, TextIO

from benchmarks.lib.compare_targets import BLOCKED_FRACTION, Target, by_key, fmt_num, ratio_target, speedup
from benchmarks.lib.data import (
    MIB,
)
from benchmarks.lib.operations import Measurement
from benchmarks.lib.report import print_table


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.2f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def _fmt_stall(stall: float | None, cpu: float | None) -> str:
    if stall is None:
        return "-"
    return f"{stall:.1f}" + ("" if cpu is None else f" (cpu {cpu:.0f})")


def _met(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "NO")


def print_report(
    report: dict[str, Any], measurements: list[Measurement], targets: list[Target], out: TextIO
) -> None:
    machine = report["machine"]
    config = report["config"]
    print(
        f"\nmachine: {machine['cpu']} x {machine['nproc']} cores, {machine['memory']}, "
        f"Linux {machine['kernel']}, Python {machine['python']}",
        file=out,
    )
    print(f"data dir filesystem: {machine['filesystem']}", file=out)
    print(
        f"load average (1 min) at start {report['load_average']['start']:.2f}, at end "
        f"{report['load_average']['end']:.2f} (other processes on the machine skew timings)",
        file=out,
    )
    impls = report["implementations"]
    ref = impls["reference"]
    print(
        f"ours: flyte_checkpoint {impls['ours']['version']}; reference: "
        + (f"flyte {ref['version']}" if ref["available"] else f"unavailable ({ref['reason']})"),
        file=out,
    )
    described = [
        f"{prefix}{k} {v['size_bytes'] / MIB:.1f} MiB in {v['files']} file(s)"
        for prefix, data in (("", report["data"]), ("s3:", report["s3_data"]))
        for k, v in data.items()
    ]
    print(
        "data: "
        + "; ".join(described)
        + f"; {config['runs']} run(s) each, fresh process per run; 1 KiB ops: median of "
        f"{config['bytes_reps']} calls per run",
        file=out,
    )
    table = by_key(measurements)
    rows: list[list[str]] = []
    seen: set[str] = set()
    for m in measurements:
        if m.op in seen:
            continue
        seen.add(m.op)
        ours = table.get((m.op, "ours"))
        ref_m = table.get((m.op, "reference"))
        ratio = speedup(ours, ref_m)
        best = speedup(ours, ref_m, best=True)
        ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
        if best is not None:
            ratio_text += f" ({best:.2f}x)"
        rule = ratio_target(m.op) if ":" not in m.op else None
        target_text, met = "-", "-"
        if rule is not None and "background" not in m.op:
            target_text = rule[1]
            met = _met(None if ratio is None else ratio >= rule[0])
        ours_text = _pair(ours)
        if "background" in m.op and ours is not None:
            summary = ours.summary()
            blocked, blocked_median = summary["blocked_s"], summary["blocked_median_s"]
            ours_text = f"blocked {_fmt_time(blocked_median)}, worst {_fmt_time(blocked)}"
            blocking = table.get(("save-dir-sync", "ours"))
            target_text = f"blocked < {BLOCKED_FRACTION:.0%} of save-dir-sync"
            if blocking is not None and blocking.wall_median_s and blocked is not None:
                fraction = blocked / blocking.wall_median_s
                ratio_text = f"{fraction:.1%} of blocking"
                met = _met(fraction < BLOCKED_FRACTION)
        rows.append([m.op, ours_text, _pair(ref_m), ratio_text, target_text, met])
    print(
        "\nwall time (min / median) of the operation call, fresh process per run; ratio = reference "
        "median / ours median (in brackets: of the minima); above 1 means we are faster",
        file=out,
    )
    print_table(rows, ["operation", "ours min / med", "reference min / med", "ratio", "target", "met?"], out)

    detail: list[list[str]] = []
    for m in measurements:
        s = m.summary()
        temp = s["peak_temp_bytes"]
        detail.append(
            [
                m.op,
                m.impl,
                fmt_num(s["throughput_mib_s"], 1) if m.op.split("-")[1:2] != ["bytes"] else "-",
                fmt_num(s["peak_rss_mib"], 0),
                fmt_num(s["rss_before_mib"], 0),
                "-" if temp is None else f"{temp / MIB:.1f} MiB" if temp else "0",
                _fmt_stall(s["stall_ms"], s["stall_cpu_ms"]),
                _fmt_time(s["blocked_s"]),
                m.error or "",
            ]
        )
    print(
        "\nfigures per operation (worst run for RSS, temp and stall; 'cpu' is the CPU time the "
        "process used during the longest stall: far below the stall means other processes had "
        "the CPUs)",
        file=out,
    )
    print_table(
        detail,
        [
            "operation",
            "impl",
            "MiB/s",
            "peak RSS MiB",
            "RSS before",
            "peak temp",
            "stall ms (cpu ms)",
            "blocked",
            "error",
        ],
        out,
    )
    if report["physical"]:
        print("\nphysical references (same data, same disk)", file=out)
    print_table(
        [
            [
                p["name"],
                _fmt_time(p["wall_min_s"]),
                _fmt_time(p["wall_median_s"]),
                fmt_num(p["throughput_mib_s"], 0),
            ]
            for p in report["physical"]
        ],
        ["command", "min", "median", "MiB/s"],
        out,
    )
    baseline = report.get("stall_baseline") or {}
    if "idle" in baseline:
        print(
            "\nevent-loop stall floor, no checkpoint code (worst of the runs): "
            + "; ".join(
                f"{v['label']} {_fmt_stall(v['max_ms'], v['max_cpu_ms'])} ms"
                for k, v in baseline.items()
                if k != "seconds"
            ),
            file=out,
        )
    print("\ntargets", file=out)
    print_table(
        [
            [t.name, "-" if t.value is None else f"{t.value:.3g}", t.threshold, _met(t.met), t.detail]
            for t in targets
        ],
        ["target", "value", "threshold", "met?", "detail"],
        out,
    )
    failed = [t for t in targets if t.met is False]
    print(
        f"\n{len(failed)} target(s) not met" + (": " + ", ".join(t.name for t in failed) if failed else ""),
        file=out,
    )


def _pair(m: Measurement | None) -> str:
    if m is None:
        return "-"
    if m.error:
        return "error"
    return f"{_fmt_time(m.wall_min_s)} / {_fmt_time(m.wall_median_s)}"
