"""Preemption, measured: a training process under a supervisor that acts like the kubelet.

    python benchmarks/preemption.py                      # local disk and shaped S3, 50 per configuration
    python benchmarks/preemption.py --storage local      # local disk only
    python benchmarks/preemption.py --quick --json       # the smoke test's run: a few preemptions, tiny state

The job (``_preemption_trainer.py``) trains a small torch model and saves its state directory
(model, optimizer and ``--extra-mib`` MiB of further state) every K steps. The supervisor starts
it as attempt 1, sends SIGTERM at a random instant after it resumed training, sends SIGKILL once
the grace period G has passed, copies the attempt's checkpoint to the previous-checkpoint
location (as ``run_with_retries`` stages it: one destination, copied to ``prev_checkpoint``
before every retry) and starts the next attempt, until an attempt reaches the run's final step.
Each attempt is a fresh process, forked from a server that has torch and both checkpoint
libraries imported (so a restart costs milliseconds, not the two seconds of imports; that cost
is printed once, not counted in the wasted time).

Three ways to use a checkpoint, each under every grace period, on local disk and on S3 (s3rver
behind ``netshape.py``: 8 MiB/s per connection, 20 ms round trip):

* ours, the one-line change: the documented loop (background saves every K steps; after the
  notice one blocking save of the newest state, then ``raise checkpoint.preemption()``);
* ours, no code change: background saves every K steps, ``install_preemption_handler()`` at the
  top as the runners do, nothing else;
* the reference SDK, ``flyte.Checkpoint`` (flyte 2.12.1): a blocking save every K steps; it has
  no preemption handling, so SIGTERM's default action ends it.

G is a multiple of the save's duration, measured first on the same storage as the run meets it:
ours' final save after a notice (writing the state directory plus the blocking ``save_sync``),
in a calibration run preempted like the others but with a grace period no save comes near
(``--calibration-saves`` of them): twice the slowest (the targets' "at least twice", for every
save measured), the shortest G that leaves two slowest saves and a step before the margin the
notice keeps free to exit (``2x+margin``), and half the quickest (shorter than any save).
Every restored state is verified (``0-meta.json``, ``model.pt`` and each extra file must name
the same step, and the extra files' digest must match the one recorded in both), and every
finished run's final model must be bit-equal to an uninterrupted run's. ``benchmarks/README.md``
("Preemption") explains the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks import s3server
from benchmarks.lib import report as reporting
from benchmarks.lib.attempts import Processes
from benchmarks.lib.data import DATA_ROOT, new_run_dir, remove
from benchmarks.lib.preemption_calibration import (
    baseline_digest,
    basis_name,
    calibrate,
    calibrate_in_run,
    cold_start_s,
    configurations,
    grace_basis,
)
from benchmarks.lib.preemption_checks import evaluate, evaluate_scenarios
from benchmarks.lib.preemption_plan import (
    CALIBRATION_GRACE_S,
    MIN_PREEMPTIONS,
    PLAIN,
    QUICK_SCALES,
    SCALES,
    SCENARIOS,
    Grace,
    Scale,
)
from benchmarks.lib.preemption_rank_trials import run_ranks
from benchmarks.lib.preemption_report import print_preemptions, print_summary
from benchmarks.lib.preemption_results import ConfigResult
from benchmarks.lib.preemption_stores import LocalStore, S3Store, Store, shaped_proxy
from benchmarks.lib.processes import terminate_as_interrupt
from benchmarks.lib.report import add_json_out, log, write_json_out
from benchmarks.lib.supervisor import Supervisor
from benchmarks.lib.targets import Check, print_targets


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--storage", default="local,s3", help="comma-separated: local,s3 (default both)")
    parser.add_argument("--preemptions", type=int, help=f"per configuration (default {MIN_PREEMPTIONS})")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 preemptions each, tiny state")
    parser.add_argument(
        "--grace",
        default="2x,2x+margin,0.5x",
        help="grace periods as multiples of the save's duration; 'Nx+margin' is N saves and a step "
        "before the margin the notice keeps free (default 2x,2x+margin,0.5x: the targets' 'at least "
        "twice', twice to save in, and shorter than one save; the reference runs at the first)",
    )
    parser.add_argument("--only", default="*", help="configuration names (globs), e.g. 's3/oneline/*'")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="issue 29's scenarios, comma-separated, or 'none' (default all: "
        + ", ".join(SCENARIOS)
        + "); each runs the one-line job on every storage it applies to",
    )
    parser.add_argument(
        "--scenario-grace",
        default="2x+margin",
        help="the scenarios' grace periods, as --grace, against each scenario's slowest final save "
        "(default 2x+margin: twice the save, the step under way and the exit margin)",
    )
    parser.add_argument(
        "--scenario-preemptions", type=int, help="per scenario configuration (default: --preemptions)"
    )
    parser.add_argument(
        "--scenario-calibration-saves",
        type=int,
        help="final saves timed per scenario, in its own calibration run (default: --calibration-saves; "
        "--quick: 1)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="exit 0 when a target is not met (errors of the harness still exit 1)",
    )
    parser.add_argument("--parallel", type=int, default=4, help="S3 configurations run at once (default 4)")
    parser.add_argument(
        "--local-parallel",
        type=int,
        default=1,
        help="local-disk configurations run at once (default 1: their saves share the disk and cores)",
    )
    parser.add_argument(
        "--calibration-saves",
        type=int,
        help="saves timed per storage: back to back, and preemptions of the calibration run (10)",
    )
    parser.add_argument("--rate-mib", type=float, default=8.0, help="S3: MiB/s per connection and direction")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="S3: added round-trip time (default 20)")
    parser.add_argument(
        "--local-mib",
        type=float,
        help=f"local: MiB of extra state (default {SCALES['local'].extra_mib:g}); with a larger state the "
        "save and so G grow past the scheduling noise of a busy machine",
    )
    parser.add_argument(
        "--local-step-ms", type=float, help=f"local: step time (default {SCALES['local'].step_s * 1000:g})"
    )
    parser.add_argument("--install-server", action="store_true", help="npm ci in benchmarks/s3rver if needed")
    parser.add_argument("--no-ranks", action="store_true", help="skip preemption_ranks.py's 4-rank scenario")
    parser.add_argument("--seed", type=int, default=21, help="seed of the SIGTERM instants")
    parser.add_argument("--json", action="store_true", help="print the full results as JSON on stdout")
    add_json_out(parser)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (event logs, stderr)")
    args = parser.parse_args(argv)
    args.storage = [s for s in args.storage.split(",") if s]
    if unknown := [s for s in args.storage if s not in SCALES]:
        parser.error(f"unknown storage: {', '.join(unknown)}")
    args.only = [p for p in args.only.split(",") if p]
    if args.preemptions is None:
        args.preemptions = 3 if args.quick else MIN_PREEMPTIONS
    if args.calibration_saves is None:
        args.calibration_saves = 2 if args.quick else 10
    if args.scenario_preemptions is None:
        args.scenario_preemptions = args.preemptions
    if args.scenario_calibration_saves is None:
        args.scenario_calibration_saves = 1 if args.quick else args.calibration_saves
    args.scenarios = [s for s in args.scenarios.split(",") if s and s != "none"]
    if unknown := [s for s in args.scenarios if s not in SCENARIOS]:
        parser.error(f"unknown scenario: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    for option in ("grace", "scenario_grace"):
        text = getattr(args, option)
        try:
            graces = [Grace.parse(item) for item in text.split(",") if item.strip()]
        except ValueError:
            parser.error(
                f"--{option.replace('_', '-')} takes multiples like 2x, 2x+margin, 0.5x; got {text!r}"
            )
        if not graces or min(grace.factor for grace in graces) <= 0:
            parser.error(f"--{option.replace('_', '-')} needs at least one multiple, each above 0")
        setattr(args, option, graces)
    counts = ("preemptions", "scenario_preemptions", "parallel", "local_parallel", "calibration_saves")
    if min(getattr(args, name) for name in (*counts, "scenario_calibration_saves")) < 1:
        parser.error("--preemptions, --parallel, --local-parallel and the calibration saves must be positive")
    return args


def describe_machine() -> dict[str, Any]:
    machine = reporting.describe_machine(DATA_ROOT)
    for package in ("torch", "flyte", "flyte_checkpoint"):
        try:
            machine[package] = version(package)
        except PackageNotFoundError:
            machine[package] = None
    return machine


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    run_dir = new_run_dir("preemption")
    processes = Processes(run_dir)
    with terminate_as_interrupt():
        try:
            return _main(args, run_dir, processes, out, argv)
        finally:
            processes.kill_all()
            if args.keep:
                log(f"kept {run_dir}")
            else:
                remove(run_dir)


def _main(
    args: argparse.Namespace, run_dir: Path, processes: Processes, out: TextIO, argv: Sequence[str] | None
) -> int:
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    scales = dict(QUICK_SCALES if args.quick else SCALES)
    if args.local_mib is not None:
        scales["local"] = replace(scales["local"], extra_mib=args.local_mib)
    if args.local_step_ms is not None:
        scales["local"] = replace(scales["local"], step_s=args.local_step_ms / 1000)
    machine = describe_machine()
    cold = None if args.quick else cold_start_s()
    print(
        f"machine: {machine['cpu']} x {machine['nproc']} cores, {machine['memory']}, "
        f"Linux {machine['kernel']}, "
        f"Python {machine['python']}, torch {machine['torch']}, flyte {machine['flyte']}, "
        f"flyte_checkpoint {machine['flyte_checkpoint']}; load average {load_start:.2f}",
        file=out,
    )
    cost = "(not measured with --quick)" if cold is None else f"takes {cold:.2f} s here"
    print(
        f"a fresh interpreter importing torch and both checkpoint libraries {cost}; attempts are "
        "forked from a server that did it once, so the restarts below exclude it",
        file=out,
    )
    storages: dict[str, Any] = {}
    results: list[ConfigResult] = []
    # One storage after the other, each calibrated right before its configurations run, so the
    # save G is a multiple of is measured in the conditions the configurations meet.
    for storage in args.storage:
        with _store(storage, args, run_dir) as store:
            if store is None:
                storages[storage] = {"skipped": True}
                continue
            setup = prepare(store, scales, processes, run_dir / storage, args, out)
            storages[storage] = setup.report
            results.extend(run_configurations(setup.supervisors, parallel_for(storage, args), processes))
    for result in results:
        print_preemptions(result, out)
    print_summary(results, out)
    checks = evaluate(results, args) + evaluate_scenarios(results)
    ranks = None if args.no_ranks else run_ranks(args, out)
    if ranks is not None:
        checks.extend(ranks["checks"])
    print_targets(checks, "targets (issue 21; scenarios and ranks: issue 29)", out)
    print(
        f"\ntotal wall time {time.monotonic() - started:.0f} s; "
        f"load average at the end {os.getloadavg()[0]:.2f}",
        file=out,
    )
    report = {
        "machine": machine,
        "cold_start_s": cold,
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "config": {
            "quick": args.quick,
            "preemptions": args.preemptions,
            "scenario_preemptions": args.scenario_preemptions,
            "scenarios": args.scenarios,
            "grace": [grace.label for grace in args.grace],
            "rate_mib": args.rate_mib,
            "rtt_ms": args.rtt_ms,
            "seed": args.seed,
        },
        "storages": storages,
        "configurations": [result.summary() for result in results],
        "ranks": None if ranks is None else ranks["report"],
        "targets": [asdict(check) for check in checks],
        "wall_s": time.monotonic() - started,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    write_json_out(args.json_out, "benchmarks/preemption.py", argv, report)
    return exit_status(results, checks, args.report_only)


def exit_status(results: list[ConfigResult], checks: list[Check], report_only: bool) -> int:
    """1 if a configuration failed, or a target is not met (unless ``report_only``); else 0."""
    if any(result.error for result in results):
        return 1
    return 0 if report_only or all(check.met is not False for check in checks) else 1


def parallel_for(storage: str, args: argparse.Namespace) -> int:
    """Configurations of ``storage`` run at once. Local ones one at a time by default: their
    saves take the disk and the cores a configuration beside them would also take, so G would
    no longer be a multiple of the save they meet. An object store's saves mostly wait on the
    network, so several configurations share the machine well."""
    parallel: int = args.local_parallel if storage == "local" else args.parallel
    return parallel


def run_configurations(
    supervisors: list[Supervisor], parallel: int, processes: Processes
) -> list[ConfigResult]:
    """Run the configurations, ``parallel`` at once; their results in the order given."""
    # The reference's last (its runs are the shortest), so no long one is left to run alone.
    order = sorted(supervisors, key=lambda s: s.config.variant == "reference")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        try:
            done = dict(zip(order, pool.map(Supervisor.run, order), strict=True))
        except BaseException:  # Ctrl-C or SIGTERM: end the supervisors' threads, or the pool waits for them
            processes.stop()
            raise
    return [done[supervisor] for supervisor in supervisors]


@dataclass
class Setup:
    supervisors: list[Supervisor]
    report: dict[str, Any]


def prepare(
    store: Store,
    scales: dict[str, Scale],
    processes: Processes,
    work: Path,
    args: argparse.Namespace,
    out: TextIO,
) -> Setup:
    """Calibrate and plan the selected configurations of ``store``: the plain ones, then each
    scenario's, G from that scenario's own final saves (its job is not the plain one)."""
    supervisors: list[Supervisor] = []
    report: dict[str, Any] = {}
    scale = scales[store.name]
    if configurations(store.name, PLAIN, [], scale, args):
        plain = prepare_plain(store, scale, processes, work, args, out)
        supervisors += plain.supervisors
        report.update(plain.report)
    report["scenarios"] = {}
    for name in args.scenarios:
        scenario = SCENARIOS[name]
        if store.name not in scenario.scales:
            continue
        scale = (scenario.quick if args.quick else scenario.scales)[store.name]
        if not configurations(store.name, name, [], scale, args):
            continue
        digest = baseline_digest(processes, scale, work)
        saves = args.scenario_calibration_saves
        own = calibrate_in_run(store, scale, processes, work, digest, args, name, rounds=2, saves=saves)
        in_run, note = own.durations, ""
        if not in_run:
            # No final save of its own completed (the scenario broke them all): G from the
            # plain job's at the same scale, and the configurations show what breaks.
            in_run = calibrate_in_run(
                store,
                scale,
                processes,
                work,
                digest,
                args,
                label=f"calibration-plain-for-{name}",
                saves=saves,
            ).durations
            note = (
                " (no final save of its own completed in calibration; its attempts ended with "
                + ", ".join(f"{kind} x{count}" for kind, count in sorted(own.endings.items()))
                + "; G from the plain job's at this scale)"
            )
        configs = configurations(store.name, name, in_run, scale, args)
        print(
            f"\n{store.name}/{name} (SIGTERM during {scenario.situation}): step "
            f"{scale.step_s * 1000:.0f} ms"
            + (f" + a C call of {scale.call_s[0]:g}-{scale.call_s[1]:g} s" if scale.call_s[1] else "")
            + f", save every {scale.every} steps, {scale.extra_mib:g} MiB of extra state, "
            f"{scale.run_steps} steps per run; its own final saves after a notice, {len(in_run)}: "
            f"median {statistics.median(in_run):.3f} s, slowest {max(in_run):.3f} s; G = "
            + ", ".join(f"{c.grace_label} = {c.grace_s:.3f} s" for c in configs)
            + note,
            file=out,
        )
        supervisors += [
            Supervisor(c, scale, store, processes, work, args.scenario_preemptions, digest, args.seed)
            for c in configs
        ]
        report["scenarios"][name] = {
            "scale": asdict(scale),
            "save_s": statistics.median(in_run),
            "grace_basis_s": {"slowest": max(in_run), "quickest": min(in_run)},
            "calibration_in_run_s": in_run,
            "calibration_endings": own.endings,
            "calibration_note": note.strip(" ()"),
            "configurations": [c.name for c in configs],
        }
    return Setup(supervisors, report)


def prepare_plain(
    store: Store, scale: Scale, processes: Processes, work: Path, args: argparse.Namespace, out: TextIO
) -> Setup:
    """Time the save on ``store``, compute the uninterrupted run's model, and plan the configurations."""
    ours = calibrate(processes, store, scale, work, "oneline", args.calibration_saves)
    reference = calibrate(processes, store, scale, work, "reference", args.calibration_saves)
    digest = baseline_digest(processes, scale, work)
    in_run = calibrate_in_run(store, scale, processes, work, digest, args).durations
    save_s = statistics.median(in_run)
    configs = configurations(store.name, PLAIN, in_run, scale, args)
    network = (
        f"; S3 through netshape, {args.rate_mib:g} MiB/s per connection, {args.rtt_ms:g} ms RTT"
        if store.name == "s3"
        else ""
    )
    print(
        f"\n{store.name}: step {scale.step_s * 1000:.0f} ms, save every {scale.every} steps, "
        f"{scale.extra_mib:g} MiB of extra state (+{_model_mib():.1f} MiB model and optimizer), "
        f"{scale.run_steps} steps per run, SIGTERM {scale.delay_s[0]:g}-{scale.delay_s[1]:g} s after "
        f"an attempt resumed training; {args.preemptions} preemptions per configuration{network}",
        file=out,
    )
    print(
        f"  save (state written + blocking save_sync), back to back, median of {len(ours)}: ours "
        f"{statistics.median(ours):.3f} s, reference {statistics.median(reference):.3f} s",
        file=out,
    )
    print(
        f"  ours' final save after a notice in the run (grace {CALIBRATION_GRACE_S:g} s, so never "
        f"cut short), {len(in_run)} saves: median {save_s:.3f} s, range {min(in_run):.3f}-"
        f"{max(in_run):.3f} s; G = "
        + ", ".join(
            f"{g.label} of the {basis_name(g.factor)} = "
            f"{g.seconds(grace_basis(in_run, g.factor), scale.step_s):.3f} s"
            for g in args.grace
        ),
        file=out,
    )
    supervisors = [
        Supervisor(c, scale, store, processes, work, args.preemptions, digest, args.seed) for c in configs
    ]
    report = {
        "scale": asdict(scale),
        "save_s": save_s,
        "grace_basis_s": {"slowest": max(in_run), "quickest": min(in_run)},
        "calibration_in_run_s": in_run,
        "calibration_ours_s": ours,
        "calibration_reference_s": reference,
        "configurations": [c.name for c in configs],
    }
    return Setup(supervisors, report)


def _model_mib() -> float:
    parameters = 64 * 256 + 256 + 256 * 64 + 64
    return parameters * 4 * 3 / (1 << 20)  # weights and Adam's two moments, float32


@contextlib.contextmanager
def _store(storage: str, args: argparse.Namespace, run_dir: Path) -> Iterator[Store | None]:
    """Local disk under the run directory, or a fresh bucket on s3rver behind the proxy."""
    if storage == "local":
        yield LocalStore(run_dir / "objects")
        return
    if not s3server.s3rver_installed() and not args.install_server:
        log(
            "S3 skipped: s3rver is not installed "
            f"(run with --install-server: npm ci in {s3server.S3RVER_DIR})"
        )
        yield None
        return
    logs = run_dir / "server-logs"
    logs.mkdir(exist_ok=True)
    bucket = f"preempt-{uuid.uuid4().hex[:8]}"
    with (
        s3server.running("s3rver", bucket, args.install_server, logs) as server,
        shaped_proxy(server.port, args.rate_mib, args.rtt_ms, logs) as endpoint,
    ):
        yield S3Store(server, endpoint, args.rate_mib, args.rtt_ms)


if __name__ == "__main__":
    sys.exit(main())
