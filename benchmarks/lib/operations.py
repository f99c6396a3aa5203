"""The compare benchmark's measured operations: what each runs in a worker, and the measurements."""

from __future__ import annotations

import fnmatch
import statistics
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib.data import (
    MIB,
    Dataset,
    remove,
)
from benchmarks.lib.report import log
from benchmarks.lib.workers import (
    Runner,
    Storage,
    WorkerError,
    object_name,
)

KINDS = ("bytes", "file", "dir")
MODES = ("sync", "async")


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


def matches(name: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) or pattern in name for pattern in patterns)


def worker_spec(op: str, kind: str, mode: str, data: Dataset, storage: Storage, impl: str) -> dict[str, Any]:
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
        if not matches(name, patterns):
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
                spec = worker_spec(op, kind, mode, data, storage, impl)
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
    spec = worker_spec("save", kind, "sync", data, storage, impl)
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
    if directory is not None and (matches("save-dir-sync", patterns) or matches("load-dir-sync", patterns)):
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
    if single is not None and (matches("save-file-sync", patterns) or matches("load-file-sync", patterns)):
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
