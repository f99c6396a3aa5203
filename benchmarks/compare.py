"""Compare flyte_checkpoint with the reference SDK (flyte 2.12.1) on the same generated data.

Run ``python benchmarks/compare.py --help``; ``benchmarks/README.md`` explains every figure.

Every measured operation runs in a fresh process (``benchmarks/_worker.py``) under the
implementation's own interpreter: ours under the interpreter that can import
``flyte_checkpoint`` (normally ``.venv/bin/python``), the reference under its cached venv
``benchmarks/.venv-reference`` (made by ``--install-reference``; never a project dependency).
Without the reference the script prints our figures only.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks._worker import tree_digest
from benchmarks.lib.data import (
    DATA_ROOT,
    MIB,
    Dataset,
    make_bytes_dataset,
    make_dir_dataset,
    make_file_dataset,
    new_run_dir,
    remove,
)
from benchmarks.lib.processes import terminate_as_interrupt
from benchmarks.lib.report import add_json_out, describe_machine, log, print_table, write_json_out
from benchmarks.lib.workers import (
    REFERENCE_REQUIREMENT,
    REFERENCE_VENV,
    Runner,
    Storage,
    WorkerError,
    find_ours,
    find_reference,
    object_name,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


SMOKE_SIZE_MIB = 8
DEFAULT_S3_SIZE_MIB = 128
DEFAULT_BYTES_REPS = 20

# Targets (see the issue): thresholds on ratios of medians.
DIR_SAVE_SPEEDUP = 10.0
DIR_LOAD_SPEEDUP = 2.0
NO_SLOWER = 1.0
TAR_FACTOR = 4.0
RSS_LIMIT_MIB = 150.0
STALL_LIMIT_MS = 50.0
BLOCKED_FRACTION = 0.10

KINDS = ("bytes", "file", "dir")
MODES = ("sync", "async")


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """All runs of one operation by one implementation on one storage."""

    op: str
    impl: str
    storage: str
    size_bytes: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def _values(self, key: str) -> list[float]:
        return [float(run[key]) for run in self.runs if run.get(key) is not None]

    @property
    def wall_min_s(self) -> float | None:
        values = self._values("wall_s")
        return min(values) if values else None

    @property
    def wall_median_s(self) -> float | None:
        values = self._values("wall_s")
        return statistics.median(values) if values else None

    @property
    def throughput_mib_s(self) -> float | None:
        median = self.wall_median_s
        return self.size_bytes / MIB / median if median else None

    def _max(self, key: str) -> float | None:
        values = self._values(key)
        return max(values) if values else None

    def _worst_stall_cpu(self) -> float | None:
        """The process CPU time during the longest stall of all runs (see ``_worker.Ticker``)."""
        runs = [run for run in self.runs if run.get("stall_ms") is not None]
        if not runs:
            return None
        worst = max(runs, key=lambda run: float(run["stall_ms"]))
        value = worst.get("stall_cpu_ms")
        return None if value is None else float(value)

    def summary(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "impl": self.impl,
            "storage": self.storage,
            "size_bytes": self.size_bytes,
            "error": self.error,
            "wall_min_s": self.wall_min_s,
            "wall_median_s": self.wall_median_s,
            "throughput_mib_s": self.throughput_mib_s,
            "peak_rss_mib": self._max("peak_rss_mib"),
            "rss_before_mib": self._max("rss_before_mib"),
            "peak_temp_bytes": self._max("peak_temp_bytes"),
            "stall_ms": self._max("stall_ms"),
            "stall_cpu_ms": self._worst_stall_cpu(),
            "blocked_s": self._max("blocked_s"),
            "blocked_median_s": (
                statistics.median(self._values("blocked_s")) if self._values("blocked_s") else None
            ),
            "runs": self.runs,
        }


@dataclass
class Physical:
    name: str
    size_bytes: int
    times: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        median = statistics.median(self.times) if self.times else None
        return {
            "name": self.name,
            "size_bytes": self.size_bytes,
            "wall_min_s": min(self.times) if self.times else None,
            "wall_median_s": median,
            "throughput_mib_s": self.size_bytes / MIB / median if median else None,
            "runs": self.times,
        }


def _matches(name: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) or pattern in name for pattern in patterns)


def _spec(op: str, kind: str, mode: str, data: Dataset, storage: Storage, impl: str) -> dict[str, Any]:
    uri = storage.uri(impl, object_name(kind))
    return {
        "op": op,
        "kind": kind,
        "mode": mode,
        "data": str(data.path),
        "dest": uri if op != "load" else storage.uri(impl, f"unused-{kind}"),
        "src": uri if op == "load" else None,
        "warmup_uri": storage.uri(impl, f"warmup-{uuid.uuid4().hex[:8]}.bin"),
        "reps": 1,
        "verify": False,
    }


def measure_storage(
    runner: Runner,
    storage: Storage,
    datasets: dict[str, Dataset],
    impls: list[str],
    runs: int,
    bytes_reps: int,
    patterns: list[str],
    background: bool,
) -> list[Measurement]:
    """Every selected operation on ``storage``: saves first, then loads of what was saved."""
    prefix = "" if storage.name == "local" else f"{storage.name}:"
    plan: list[tuple[str, str, str]] = []
    for op in ("save", "load"):
        for kind in KINDS:
            if kind not in datasets:
                continue
            for mode in MODES:
                plan.append((op, kind, mode))
            if op == "save" and kind == "dir" and background:
                plan.extend([("save-background", "dir", "sync"), ("save-background", "dir", "async")])
    measurements: list[Measurement] = []
    for op, kind, mode in plan:
        name = f"{prefix}{op}-{kind}-{mode}"
        if not _matches(name, patterns):
            continue
        op_impls = ["ours"] if op == "save-background" else impls
        data = datasets[kind]
        results = {impl: Measurement(name, impl, storage.name, data.size_bytes) for impl in op_impls}
        log(f"{name}: {runs} run(s) x {', '.join(op_impls)}")
        for run in range(runs):
            for impl in op_impls:
                measurement = results[impl]
                if measurement.error is not None:
                    continue
                spec = _spec(op, kind, mode, data, storage, impl)
                spec["reps"] = bytes_reps if kind == "bytes" else 1
                spec["verify"] = op == "load" and run == 0
                try:
                    if op == "load":
                        ensure_object(runner, storage, impl, kind, data)
                    elif storage.name == "local":
                        remove(Path(spec["dest"]))
                    result = runner.worker(impl, spec, storage)
                except WorkerError as exc:
                    measurement.error = str(exc).splitlines()[0]
                    log(f"  FAILED: {exc}")
                    continue
                if op == "save" and mode == "sync":
                    runner.produced.add((storage.name, impl, kind))
                if spec["verify"] and result.get("digest") != data.digest:
                    measurement.error = "restored content differs from the saved data"
                    log(f"  FAILED: {impl} {name}: {measurement.error}")
                measurement.runs.append(result)
                log(
                    f"  run {run + 1} {impl:9s} {result['wall_s']:.4f} s"
                    f"  rss {result['peak_rss_mib']:.0f} MiB  temp {result['peak_temp_bytes']} B"
                    + (f"  stall {result['stall_ms']:.1f} ms" if "stall_ms" in result else "")
                    + (f"  blocked {result['blocked_s'] * 1000:.1f} ms" if "blocked_s" in result else "")
                )
        measurements.extend(results.values())
    return measurements


def measure_stall_baseline(runner: Runner, storage: Storage, runs: int, smoke: bool) -> dict[str, Any]:
    """The event-loop stall this machine shows with no checkpoint code at all (see the worker)."""
    seconds = 0.2 if smoke else 1.0
    baseline: dict[str, Any] = {"seconds": seconds}
    for kind, label in (("idle", "to_thread(sleep)"), ("python", "to_thread(pure-Python loop)")):
        stalls = []
        for _ in range(runs):
            spec = {"op": "stall-baseline", "kind": kind, "mode": "async", "seconds": seconds}
            result = runner.worker("ours", spec, storage)
            stalls.append((float(result["stall_ms"]), float(result["stall_cpu_ms"])))
        worst = max(stalls)
        baseline[kind] = {
            "label": label,
            "max_ms": worst[0],
            "max_cpu_ms": worst[1],
            "median_ms": statistics.median(stall for stall, _ in stalls),
        }
        log(f"stall baseline {label}: worst {worst[0]:.1f} ms")
    return baseline


def ensure_object(runner: Runner, storage: Storage, impl: str, kind: str, data: Dataset) -> None:
    """Make sure ``impl`` has saved ``kind`` to ``storage`` (when loads run without their saves)."""
    if (storage.name, impl, kind) in runner.produced:
        return
    spec = _spec("save", kind, "sync", data, storage, impl)
    runner.worker(impl, spec, storage)
    runner.produced.add((storage.name, impl, kind))


def measure_physical(
    runner: Runner, datasets: dict[str, Dataset], runs: int, patterns: list[str]
) -> list[Physical]:
    """``tar -cf`` / ``tar -xf`` / ``cp -r`` of the directory and ``cp`` of the file."""
    out = runner.run_dir / "physical"
    out.mkdir(parents=True, exist_ok=True)
    results: list[Physical] = []
    directory = datasets.get("dir")
    if directory is not None and (_matches("save-dir-sync", patterns) or _matches("load-dir-sync", patterns)):
        tar_path = out / "dir.tar"
        extract = out / "extracted"
        copy = out / "copied"
        tar_cf = Physical("tar -cf (directory)", directory.size_bytes)
        tar_cf_sync = Physical("tar -cf + sync (directory)", directory.size_bytes)
        tar_xf = Physical("tar -xf (directory, uncompressed tar)", directory.size_bytes)
        cp_r = Physical("cp -r (directory)", directory.size_bytes)
        for _ in range(runs):
            tar_cf.times.append(
                runner.timed_command(
                    ["tar", "-cf", str(tar_path), "-C", str(directory.path), "."],
                    lambda: remove(tar_path),
                )
            )
            tar_cf_sync.times.append(
                runner.timed_command(
                    [
                        "sh",
                        "-c",
                        'tar -cf "$1" -C "$2" . && sync "$1"',
                        "sh",
                        str(tar_path),
                        str(directory.path),
                    ],
                    lambda: remove(tar_path),
                )
            )

            def fresh_extract() -> None:
                remove(extract)
                extract.mkdir()

            tar_xf.times.append(
                runner.timed_command(["tar", "-xf", str(tar_path), "-C", str(extract)], fresh_extract)
            )
            cp_r.times.append(
                runner.timed_command(["cp", "-r", str(directory.path), str(copy)], lambda: remove(copy))
            )
        remove(tar_path)
        remove(extract)
        remove(copy)
        results.extend([tar_cf, tar_cf_sync, tar_xf, cp_r])
    single = datasets.get("file")
    if single is not None and (_matches("save-file-sync", patterns) or _matches("load-file-sync", patterns)):
        target = out / "file.bin"
        cp = Physical("cp (file)", single.size_bytes)
        cp_sync = Physical("cp + sync (file)", single.size_bytes)
        for _ in range(runs):
            cp.times.append(
                runner.timed_command(["cp", str(single.path), str(target)], lambda: remove(target))
            )
            cp_sync.times.append(
                runner.timed_command(
                    ["sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", str(single.path), str(target)],
                    lambda: remove(target),
                )
            )
        remove(target)
        results.extend([cp, cp_sync])
    for physical in results:
        log(f"{physical.name}: median {statistics.median(physical.times):.3f} s")
    return results


# ---------------------------------------------------------------------------------------------
# Compatibility: our objects stay standard, and the reference's load with us
# ---------------------------------------------------------------------------------------------


def check_compat(
    runner: Runner, storage: Storage, datasets: dict[str, Dataset], impls: list[str]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    directory = datasets.get("dir")
    if directory is not None and storage.name == "local":
        ensure_object(runner, storage, "ours", "dir", directory)
        ours_object = Path(storage.uri("ours", object_name("dir")))
        extract = runner.run_dir / "compat-extract"
        remove(extract)
        extract.mkdir()
        done = subprocess.run(
            ["tar", "-xzf", str(ours_object), "-C", str(extract)], capture_output=True, text=True
        )
        ok = done.returncode == 0 and tree_digest(extract) == directory.digest
        checks.append(
            {
                "name": "tar -xzf reads our directory object (same tree)",
                "ok": ok,
                "detail": done.stderr.strip()[-300:] if done.returncode else "",
            }
        )
        remove(extract)
    if "reference" in impls:
        for kind in ("dir", "file"):
            data = datasets.get(kind)
            if data is None:
                continue
            for writer, reader in (("ours", "reference"), ("reference", "ours")):
                name = f"{reader} loads {writer}'s {kind} object ({storage.name})"
                try:
                    ensure_object(runner, storage, writer, kind, data)
                    spec = _spec("load", kind, "sync", data, storage, writer)
                    spec["dest"] = storage.uri(reader, f"unused-{kind}")
                    spec["verify"] = True
                    result = runner.worker(reader, spec, storage)
                    ok = result.get("digest") == data.digest
                    detail = "" if ok else "restored content differs"
                except WorkerError as exc:
                    ok, detail = False, str(exc).splitlines()[0]
                checks.append({"name": name, "ok": ok, "detail": detail})
    for check in checks:
        log(f"compat: {check['name']}: {'ok' if check['ok'] else 'FAILED ' + check['detail']}")
    return checks


# ---------------------------------------------------------------------------------------------
# Targets and the report
# ---------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    value: float | None
    threshold: str
    met: bool | None
    detail: str = ""


def _by_key(measurements: list[Measurement]) -> dict[tuple[str, str], Measurement]:
    return {(m.op, m.impl): m for m in measurements}


def _speedup(ours: Measurement | None, ref: Measurement | None, *, best: bool = False) -> float | None:
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


def _ratio_target(op: str) -> tuple[float, str] | None:
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
    table = _by_key(measurements)
    for m in measurements:
        if m.impl != "ours" or m.storage != "local" or "background" in m.op:
            continue
        rule = _ratio_target(m.op)
        if rule is None:
            continue
        threshold, text = rule
        ratio = _speedup(m, table.get((m.op, "reference")))
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
                    f"{_fmt_num(worst_stall.summary()['stall_cpu_ms'], 0, ' ms')}",
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


def _fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


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
    table = _by_key(measurements)
    rows: list[list[str]] = []
    seen: set[str] = set()
    for m in measurements:
        if m.op in seen:
            continue
        seen.add(m.op)
        ours = table.get((m.op, "ours"))
        ref_m = table.get((m.op, "reference"))
        ratio = _speedup(ours, ref_m)
        best = _speedup(ours, ref_m, best=True)
        ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
        if best is not None:
            ratio_text += f" ({best:.2f}x)"
        rule = _ratio_target(m.op) if ":" not in m.op else None
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
                _fmt_num(s["throughput_mib_s"], 1) if m.op.split("-")[1:2] != ["bytes"] else "-",
                _fmt_num(s["peak_rss_mib"], 0),
                _fmt_num(s["rss_before_mib"], 0),
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
                _fmt_num(p["throughput_mib_s"], 0),
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


# ---------------------------------------------------------------------------------------------
# Machine description
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark flyte_checkpoint against the reference SDK (flyte 2.12.1).",
    )
    parser.add_argument("--size-mib", type=int, default=512, help="directory size in MiB (default 512)")
    parser.add_argument(
        "--file-mib", type=int, default=None, help="single-file size in MiB (default: --size-mib)"
    )
    parser.add_argument("--runs", type=int, default=3, help="fresh-process runs per operation (default 3)")
    parser.add_argument(
        "--bytes-reps", type=int, default=DEFAULT_BYTES_REPS, help="calls per run for the 1 KiB payload"
    )
    parser.add_argument(
        "--install-reference",
        action="store_true",
        help=f"create {REFERENCE_VENV.relative_to(REPO)} with {REFERENCE_REQUIREMENT} if missing",
    )
    parser.add_argument("--no-reference", action="store_true", help="measure our implementation only")
    parser.add_argument("--s3", action="store_true", help="also measure on the test suite's moto S3 server")
    parser.add_argument(
        "--s3-size-mib",
        type=int,
        default=None,
        help=f"directory and file size on S3 (default {DEFAULT_S3_SIZE_MIB}; moto's speed dominates)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated operation names or globs, e.g. 'save-dir-*,load-file-sync' or 'dir'",
    )
    parser.add_argument("--json", action="store_true", help="print the full results as JSON on stdout")
    add_json_out(parser)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny data ({SMOKE_SIZE_MIB} MiB), 1 run, no reference unless --install-reference (for CI)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.size_mib = SMOKE_SIZE_MIB
        args.file_mib = args.file_mib or SMOKE_SIZE_MIB
        args.runs = 1
        args.bytes_reps = 3
        args.s3_size_mib = args.s3_size_mib or SMOKE_SIZE_MIB
        if not args.install_reference:
            args.no_reference = True
    args.file_mib = args.file_mib or args.size_mib
    args.s3_size_mib = args.s3_size_mib or min(DEFAULT_S3_SIZE_MIB, args.size_mib)
    if args.size_mib < 1 or args.file_mib < 1 or args.runs < 1 or args.bytes_reps < 1:
        parser.error("sizes, --runs and --bytes-reps must be positive")
    return args


def _operation_names(prefix: str, kind: str) -> list[str]:
    """Every operation name that uses ``kind`` of data (background saves exist for directories)."""
    ops = ["save", "load", "save-background"] if kind == "dir" and not prefix else ["save", "load"]
    return [f"{prefix}{op}-{kind}-{mode}" for op in ops for mode in MODES]


def _datasets_for(size_mib: int, file_mib: int, patterns: list[str], prefix: str) -> dict[str, Dataset]:
    datasets: dict[str, Dataset] = {}
    wanted = {
        kind for kind in KINDS if any(_matches(name, patterns) for name in _operation_names(prefix, kind))
    }
    if "bytes" in wanted:
        datasets["bytes"] = make_bytes_dataset()
    if "file" in wanted:
        datasets["file"] = make_file_dataset(file_mib)
    if "dir" in wanted:
        datasets["dir"] = make_dir_dataset(size_mib)
    return datasets


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    patterns = [p.strip() for p in args.only.split(",") if p.strip()]
    out = sys.stderr if args.json else sys.stdout
    run_dir = new_run_dir("run")
    with terminate_as_interrupt():
        try:
            return _main(args, patterns, out, run_dir, argv)
        finally:
            remove(run_dir)


def _main(
    args: argparse.Namespace, patterns: list[str], out: TextIO, run_dir: Path, argv: Sequence[str] | None
) -> int:
    load_start = os.getloadavg()[0]
    if load_start > 0.5:
        log(f"warning: load average is {load_start:.2f}: other processes will skew the timings")
    ours = find_ours()
    reference = find_reference(args.install_reference, not args.no_reference)
    if not reference.available:
        log(f"reference SDK unavailable: {reference.reason}; printing our figures only")
    interpreters = {"ours": ours, "reference": reference}
    impls = ["ours", "reference"] if reference.available else ["ours"]
    runner = Runner(run_dir, interpreters)
    (run_dir / "objects").mkdir(parents=True)
    local = Storage("local", str(run_dir / "objects"))
    for impl in impls:
        (run_dir / "objects" / impl).mkdir()

    datasets = _datasets_for(args.size_mib, args.file_mib, patterns, "")
    measurements = measure_storage(
        runner, local, datasets, impls, args.runs, args.bytes_reps, patterns, background=True
    )
    physical = measure_physical(runner, datasets, args.runs, patterns)
    baseline = measure_stall_baseline(runner, local, args.runs, args.smoke)
    compat = check_compat(runner, local, datasets, impls)

    s3_info: dict[str, Any] = {"requested": args.s3}
    s3_datasets: dict[str, Dataset] = {}
    if args.s3:
        s3_datasets = _datasets_for(args.s3_size_mib, args.s3_size_mib, patterns, "s3:")
        measurements_s3, compat_s3, s3_info = run_s3(runner, s3_datasets, impls, args, patterns)
        measurements.extend(measurements_s3)
        compat.extend(compat_s3)

    targets = evaluate_targets(measurements, physical, compat, reference.available)
    report: dict[str, Any] = {
        "machine": describe_machine(DATA_ROOT),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "config": {
            "size_mib": args.size_mib,
            "file_mib": args.file_mib,
            "runs": args.runs,
            "bytes_reps": args.bytes_reps,
            "smoke": args.smoke,
            "only": patterns,
            "s3_size_mib": args.s3_size_mib if args.s3 else None,
        },
        "implementations": {
            "ours": {"available": True, "python": ours.python, "version": ours.version},
            "reference": {
                "available": reference.available,
                "python": reference.python,
                "version": reference.version,
                "reason": reference.reason,
            },
        },
        "data": {k: {**asdict(v), "path": str(v.path)} for k, v in datasets.items()},
        "s3_data": {k: {**asdict(v), "path": str(v.path)} for k, v in s3_datasets.items()},
        "results": [m.summary() for m in measurements],
        "physical": [p.summary() for p in physical],
        "stall_baseline": baseline,
        "compat": compat,
        "s3": s3_info,
        "targets": [asdict(t) for t in targets],
    }
    print_report(report, measurements, targets, out)
    if args.json:
        print(json.dumps(report, indent=2))
    write_json_out(args.json_out, "benchmarks/compare.py", argv, report)
    errors = [m for m in measurements if m.error and m.impl == "ours"]
    return 1 if errors else 0


def run_s3(
    runner: Runner,
    datasets: dict[str, Dataset],
    impls: list[str],
    args: argparse.Namespace,
    patterns: list[str],
) -> tuple[list[Measurement], list[dict[str, Any]], dict[str, Any]]:
    sys.path.insert(0, str(REPO))
    try:
        # Imported by name: the test suite's helper module is not part of the benchmark's types.
        servers = importlib.import_module("tests.storage_servers")
    except ImportError as exc:
        log(f"S3 skipped: cannot import tests/storage_servers.py ({exc})")
        return [], [], {"requested": True, "available": False, "reason": str(exc)}
    try:
        server = servers.start_moto(log_dir=runner.run_dir / "moto")
    except (servers.ServerUnavailableError, RuntimeError) as exc:
        log(f"S3 skipped: {exc}")
        return [], [], {"requested": True, "available": False, "reason": str(exc)}
    try:
        bucket = servers.create_bucket(server, "bench")
        options = server.storage_options
        env = {
            "FLYTE_AWS_ENDPOINT": server.endpoint,
            "FLYTE_AWS_ACCESS_KEY_ID": str(options["key"]),
            "FLYTE_AWS_SECRET_ACCESS_KEY": str(options["secret"]),
            "AWS_REGION": str(options["client_kwargs"]["region_name"]),
            "AWS_DEFAULT_REGION": str(options["client_kwargs"]["region_name"]),
        }
        storage = Storage("s3", f"s3://{bucket}", storage_options=options, env=env)
        log(f"S3: moto at {server.endpoint}, bucket {bucket}")
        measurements = measure_storage(
            runner, storage, datasets, impls, args.runs, args.bytes_reps, patterns, background=False
        )
        compat = check_compat(runner, storage, datasets, impls)
    finally:
        server.stop()
    return measurements, compat, {"requested": True, "available": True, "endpoint": server.endpoint}


if __name__ == "__main__":
    sys.exit(main())
