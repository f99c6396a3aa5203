"""The compare benchmark's targets: thresholds on ratios of medians, judged from the measurements."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.operations import MODES, Measurement, Physical

# Targets (see the issue): thresholds on ratios of medians.
DIR_SAVE_SPEEDUP = 10.0
DIR_LOAD_SPEEDUP = 2.0
NO_SLOWER = 1.0
TAR_FACTOR = 4.0
RSS_LIMIT_MIB = 150.0
STALL_LIMIT_MS = 50.0
BLOCKED_FRACTION = 0.10


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


@dataclass
class Target:
    name: str
    value: float | None
    threshold: str
    met: bool | None
    detail: str = ""


def by_key(measurements: list[Measurement]) -> dict[tuple[str, str], Measurement]:
    return {(m.op, m.impl): m for m in measurements}


def speedup(ours: Measurement | None, ref: Measurement | None, *, best: bool = False) -> float | None:
    """Reference time / our time, of the medians (or of the minima with ``best``)."""
    if ours is None or ref is None or ours.error or ref.error:
        return None
    if best:
        ours_t, ref_t = ours.wall_min_s, ref.wall_min_s
    else:
        ours_t, ref_t = ours.wall_median_s, ref.wall_median_s
    if not ours_t or ref_t is None:
        return None
    return ref_t / ours_t


def ratio_target(op: str) -> tuple[float, str] | None:
    if op.startswith("save-dir-") and "background" not in op:
        return DIR_SAVE_SPEEDUP, f">= {DIR_SAVE_SPEEDUP:g}x faster"
    if op.startswith("load-dir-"):
        return DIR_LOAD_SPEEDUP, f">= {DIR_LOAD_SPEEDUP:g}x faster"
    if op.split("-")[1] in ("file", "bytes") and ":" not in op:
        return NO_SLOWER, "no slower"
    return None


def evaluate_targets(
    measurements: list[Measurement], physical: list[Physical], compat: list[dict[str, Any]], have_ref: bool
) -> list[Target]:
    targets: list[Target] = []
    table = by_key(measurements)
    for m in measurements:
        if m.impl != "ours" or m.storage != "local" or "background" in m.op:
            continue
        rule = ratio_target(m.op)
        if rule is None:
            continue
        threshold, text = rule
        ratio = speedup(m, table.get((m.op, "reference")))
        met = None if ratio is None else ratio >= threshold
        targets.append(Target(f"{m.op}: reference / ours", ratio, text, met))
    ours_dir_save = table.get(("save-dir-sync", "ours"))
    tar = next((p for p in physical if p.name == "tar -cf (directory)"), None)
    if ours_dir_save is not None and tar is not None and ours_dir_save.wall_median_s and tar.times:
        factor = ours_dir_save.wall_median_s / statistics.median(tar.times)
        targets.append(
            Target("save-dir-sync: ours / tar -cf", factor, f"<= {TAR_FACTOR:g}x", factor <= TAR_FACTOR)
        )
    ours = [m for m in measurements if m.impl == "ours" and not m.error and m.runs]
    local_ours = [m for m in ours if m.storage == "local"]
    remote_ours = [m for m in ours if m.storage != "local"]
    if remote_ours:
        worst_remote = max(remote_ours, key=lambda m: m.summary()["peak_rss_mib"] or 0.0)
        remote_rss = worst_remote.summary()["peak_rss_mib"]
        targets.append(
            Target(
                "peak RSS, any of our S3 operations",
                remote_rss,
                f"< {RSS_LIMIT_MIB:g} MiB",
                remote_rss is not None and remote_rss < RSS_LIMIT_MIB,
                f"worst: {worst_remote.op}; {worst_remote.summary()['rss_before_mib']:.0f} MiB before it",
            )
        )
    if local_ours:
        worst = max(local_ours, key=lambda m: m.summary()["peak_rss_mib"] or 0.0)
        value = worst.summary()["peak_rss_mib"]
        targets.append(
            Target(
                "peak RSS, any of our local operations",
                value,
                f"< {RSS_LIMIT_MIB:g} MiB",
                value is not None and value < RSS_LIMIT_MIB,
                f"worst: {worst.op}",
            )
        )
        temp = max((m.summary()["peak_temp_bytes"] or 0.0) for m in local_ours)
        targets.append(
            Target("peak temporary bytes on disk, any of our local operations", temp, "== 0", temp == 0)
        )
        stalls = [m for m in local_ours if m.summary()["stall_ms"] is not None]
        if stalls:
            worst_stall = max(stalls, key=lambda m: m.summary()["stall_ms"])
            stall = worst_stall.summary()["stall_ms"]
            targets.append(
                Target(
                    "longest event-loop stall in await save()/load()",
                    stall,
                    f"< {STALL_LIMIT_MS:g} ms",
                    stall < STALL_LIMIT_MS,
                    f"worst: {worst_stall.op}; process CPU during it "
                    f"{fmt_num(worst_stall.summary()['stall_cpu_ms'], 0, ' ms')}",
                )
            )
    blocking = table.get(("save-dir-sync", "ours"))
    for mode in MODES:
        background = table.get((f"save-background-dir-{mode}", "ours"))
        if background is None or background.error or blocking is None or not blocking.wall_median_s:
            continue
        blocked = background.summary()["blocked_s"]
        fraction = blocked / blocking.wall_median_s
        targets.append(
            Target(
                f"background save ({mode}): caller blocked / blocking save",
                fraction,
                f"< {BLOCKED_FRACTION:.0%}",
                fraction < BLOCKED_FRACTION,
                f"blocked {blocked * 1000:.1f} ms",
            )
        )
    for check in compat:
        targets.append(Target(f"format: {check['name']}", None, "passes", bool(check["ok"]), check["detail"]))
    for m in measurements:
        if m.error:
            targets.append(Target(f"{m.impl} {m.op} ran", None, "no error", False, m.error))
    if not have_ref:
        targets.append(Target("reference comparisons", None, "reference installed", None, "skipped"))
    return targets
