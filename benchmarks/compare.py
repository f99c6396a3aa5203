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
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks.lib.compare_compat import check_compat
from benchmarks.lib.compare_report import print_report
from benchmarks.lib.compare_targets import evaluate_targets
from benchmarks.lib.data import (
    DATA_ROOT,
    Dataset,
    make_bytes_dataset,
    make_dir_dataset,
    make_file_dataset,
    new_run_dir,
    remove,
)
from benchmarks.lib.operations import (
    KINDS,
    MODES,
    Measurement,
    matches,
    measure_physical,
    measure_stall_baseline,
    measure_storage,
)
from benchmarks.lib.processes import terminate_as_interrupt
from benchmarks.lib.report import add_json_out, describe_machine, log, write_json_out
from benchmarks.lib.workers import (
    REFERENCE_REQUIREMENT,
    REFERENCE_VENV,
    Runner,
    Storage,
    find_ours,
    find_reference,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


SMOKE_SIZE_MIB = 8
DEFAULT_S3_SIZE_MIB = 128
DEFAULT_BYTES_REPS = 20


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
        kind for kind in KINDS if any(matches(name, patterns) for name in _operation_names(prefix, kind))
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
