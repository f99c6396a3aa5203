"""Checkpoints on object stores over a shaped network: ours, the reference SDK, and boto3.

Every client talks to the S3 server through ``netshape.py`` (by default 8 MiB/s per connection
and direction, 20 ms added round trip: a scaled-down real network), each operation in a fresh
process (``_objectstore_worker.py``), median of ``--runs``. It prints MiB/s, the ratio to the
reference SDK, peak RSS, requests per operation, the most connections open at once and the line
(cap x connections), then the targets of issue 12 with met / not met.

    python benchmarks/objectstore.py --install-server --install-reference     # 256 MiB, 3 runs
    python benchmarks/objectstore.py --backend gcs                            # our figures only

The S3 server is s3rver (``benchmarks/s3rver``, installed by ``--install-server``); ``--server
moto`` uses the test suite's moto instead (whose ranged GETs re-read the whole object).
``benchmarks/README.md`` ("Object stores on a shaped network") explains the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks import netshape, s3server
from benchmarks.lib.data import (
    DATA_ROOT,
    Dataset,
    make_bytes_dataset,
    make_dir_dataset,
    make_file_dataset,
    new_run_dir,
    remove,
)
from benchmarks.lib.processes import terminate_as_interrupt
from benchmarks.lib.report import add_json_out, describe_machine, log, print_table, write_json_out
from benchmarks.lib.targets import Check, print_targets
from benchmarks.lib.workers import (
    Interpreter,
    Runner,
    Storage,
    WorkerError,
    find_ours,
    find_reference,
    object_name,
)

HERE = Path(__file__).resolve().parent
MIB = 1 << 20

# The workers wrap _worker.py with the proxy mark and boto3.
WORKER = HERE / "_objectstore_worker.py"

OPS = ("save-file", "save-dir", "save-bytes", "load-file", "load-dir", "load-bytes")
CLIENTS = ("ours", "reference", "boto3")
BOTO3_OPS = ("save-file", "load-file", "save-bytes", "load-bytes")
BOTO3_THREADS = 16

SAVE_SPEEDUP = 2.0
LOAD_SPEEDUP = 4.0
LINE_FRACTION = 0.70
LINE_CONNECTIONS = (8, 16)
RSS_LIMIT_MIB = 200.0
EMULATORS = {"gcs": "fake-gcs-server", "azure": "Azurite"}


@dataclass
class Result:
    """All runs of one operation by one client."""

    op: str
    client: str
    size_bytes: int
    reps: int
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def _median(self, key: str) -> float | None:
        values = [float(run[key]) for run in self.runs if run.get(key) is not None]
        return statistics.median(values) if values else None

    @property
    def wall_s(self) -> float | None:
        return self._median("wall_s")

    @property
    def mib_s(self) -> float | None:
        wall = self.wall_s
        return self.size_bytes / MIB / wall if wall else None

    @property
    def peak_rss_mib(self) -> float | None:
        values = [float(run["peak_rss_mib"]) for run in self.runs if "peak_rss_mib" in run]
        return max(values) if values else None

    @property
    def requests(self) -> float | None:
        value = self._median("requests")
        return None if value is None else value / self.reps

    @property
    def proxied_mib(self) -> float | None:
        """Bytes through the proxy, both directions: about the size when nothing went around it."""
        values = [(run["bytes_up"] + run["bytes_down"]) / MIB for run in self.runs if "bytes_up" in run]
        return statistics.median(values) / self.reps if values else None

    @property
    def connections(self) -> int | None:
        values = [int(run["peak_connections"]) for run in self.runs if "peak_connections" in run]
        return max(values) if values else None

    def summary(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "client": self.client,
            "size_bytes": self.size_bytes,
            "error": self.error,
            "wall_median_s": self.wall_s,
            "mib_s": self.mib_s,
            "peak_rss_mib": self.peak_rss_mib,
            "requests_per_op": self.requests,
            "peak_connections": self.connections,
            "proxied_mib": self.proxied_mib,
            "runs": self.runs,
        }


def line_mib_s(rate: float, connections: int | None) -> float:
    """The line a transfer is judged against: the cap times 8 to 16 connections."""
    low, high = LINE_CONNECTIONS
    return rate * min(high, max(low, connections or 1))


# ---------------------------------------------------------------------------------------------
# Servers behind the proxy
# ---------------------------------------------------------------------------------------------


@dataclass
class Target:
    """A server reached through the proxy: the storage the workers use."""

    storage: Storage
    server_name: str
    direct: Storage  # the same bucket without the proxy (for the ceiling)


def _s3_storage(server: s3server.S3Server, endpoint: str, extra: dict[str, Any]) -> Storage:
    options = {
        "key": server.key,
        "secret": server.secret,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": s3server.REGION},
        **extra,
    }
    env = {
        "FLYTE_AWS_ENDPOINT": endpoint,
        "FLYTE_AWS_ACCESS_KEY_ID": server.key,
        "FLYTE_AWS_SECRET_ACCESS_KEY": server.secret,
        "AWS_REGION": s3server.REGION,
        "AWS_DEFAULT_REGION": s3server.REGION,
    }
    return Storage("s3", f"s3://{server.bucket}", storage_options=options, env=env)


def _our_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--option KEY=VALUE`` (a JSON value, else a string): extra storage options for ours."""
    options: dict[str, Any] = {}
    for given in args.option:
        key, _, value = given.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


@contextlib.contextmanager
def s3_target(args: argparse.Namespace, run_dir: Path) -> Iterator[tuple[Target, netshape.ShapedProxy]]:
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    logs = run_dir / "server-logs"
    with (
        s3server.running(args.server, bucket, args.install_server, logs) as server,
        netshape.ShapedProxy(server.port, args.rate_mib, args.rtt_ms) as proxy,
    ):
        storage = _s3_storage(server, proxy.endpoint, _our_options(args))
        storage.env["NETSHAPE_MARK_PORT"] = str(proxy.mark_port)
        yield Target(storage, server.name, _s3_storage(server, server.endpoint, {})), proxy


def _replace_endpoint(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {key: _replace_endpoint(item, old, new) for key, item in value.items()}
    return value


@contextlib.contextmanager
def emulator_target(args: argparse.Namespace, run_dir: Path) -> Iterator[tuple[Target, netshape.ShapedProxy]]:
    """fake-gcs-server or Azurite (the test suite's start functions) behind the proxy."""
    servers = s3server._test_servers()
    start = servers.start_fake_gcs if args.backend == "gcs" else servers.start_azurite
    server = start(log_dir=run_dir / "server-logs")
    try:
        bucket = servers.create_bucket(server, "bench")
        with netshape.ShapedProxy(server.port, args.rate_mib, args.rtt_ms) as proxy:
            options = _replace_endpoint(server.storage_options, server.endpoint, proxy.endpoint)
            options.update(_our_options(args))
            env = _replace_endpoint(server.env, server.endpoint, proxy.endpoint)
            env["NETSHAPE_MARK_PORT"] = str(proxy.mark_port)
            base = server.url(bucket)
            storage = Storage(args.backend, base.rstrip("/"), storage_options=options, env=env)
            direct = Storage(args.backend, base.rstrip("/"), storage_options=server.storage_options)
            yield Target(storage, EMULATORS[args.backend], direct), proxy
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


def _kind(op: str) -> str:
    return op.split("-", 1)[1]


def _spec(op: str, client: str, data: Dataset, storage: Storage, reps: int) -> dict[str, Any]:
    action, kind = op.split("-", 1)
    name = f"{client}/{object_name(kind)}"
    return {
        "op": action,
        "kind": kind,
        "mode": "sync",
        "data": str(data.path),
        "dest": f"{storage.base}/{name}" if action == "save" else f"{storage.base}/{client}/unused-{kind}",
        "src": f"{storage.base}/{name}" if action == "load" else None,
        "warmup_uri": f"{storage.base}/{client}/warmup-{uuid.uuid4().hex[:8]}.bin",
        "reps": reps,
        "verify": False,
        "threads": BOTO3_THREADS,
    }


def measure(
    runner: Runner,
    target: Target,
    proxy: netshape.ShapedProxy,
    datasets: dict[str, Dataset],
    clients: list[str],
    ops: list[str],
    args: argparse.Namespace,
) -> list[Result]:
    results: list[Result] = []
    produced: set[tuple[str, str]] = set()
    for op in ops:
        kind = _kind(op)
        data = datasets[kind]
        reps = args.bytes_reps if kind == "bytes" else 1
        for client in clients:
            if client == "boto3" and op not in BOTO3_OPS:
                continue
            result = Result(op, client, data.size_bytes, reps)
            results.append(result)
            log(f"{op} {client}: {args.runs} run(s)")
            for run in range(args.runs):
                spec = _spec(op, client, data, target.storage, reps)
                spec["verify"] = op.startswith("load") and run == 0 and client != "boto3"
                try:
                    if op.startswith("load") and (client, kind) not in produced:
                        runner.worker(
                            client, _spec(f"save-{kind}", client, data, target.storage, 1), target.storage
                        )
                        produced.add((client, kind))
                    proxy.reset()
                    figures = runner.worker(client, spec, target.storage)
                except WorkerError as exc:
                    result.error = str(exc).splitlines()[0]
                    log(f"  FAILED: {exc}")
                    break
                figures.update(proxy.snapshot())
                if op.startswith("save"):
                    produced.add((client, kind))
                if spec["verify"] and figures.get("digest") != data.digest:
                    result.error = "restored content differs from the saved data"
                    log(f"  FAILED: {client} {op}: {result.error}")
                result.runs.append(figures)
                log(
                    f"  run {run + 1}: {figures['wall_s']:.3f} s, rss {figures['peak_rss_mib']:.0f} MiB,"
                    f" {figures['requests']} requests, {figures['peak_connections']} connections"
                )
    return results


def measure_ceiling(runner: Runner, target: Target, data: Dataset) -> dict[str, Any] | None:
    """The S3 server's unshaped speed, with boto3 straight to it (no proxy)."""
    spec = _spec("save-file", "boto3", data, target.direct, 1)
    spec["op"] = "ceiling"
    spec["dest"] = f"{target.direct.base}/ceiling/{uuid.uuid4().hex[:8]}.bin"
    try:
        return runner.worker("boto3", spec, target.direct)
    except WorkerError as exc:
        log(f"ceiling FAILED: {exc}")
        return {"error": str(exc).splitlines()[0]}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _find(results: list[Result], op: str, client: str) -> Result | None:
    for result in results:
        if result.op == op and result.client == client and not result.error and result.runs:
            return result
    return None


def evaluate(results: list[Result], rate: float) -> list[Check]:
    checks: list[Check] = []
    for op, factor in (
        ("save-file", SAVE_SPEEDUP),
        ("save-dir", SAVE_SPEEDUP),
        ("load-file", LOAD_SPEEDUP),
        ("load-dir", LOAD_SPEEDUP),
    ):
        ours, reference = _find(results, op, "ours"), _find(results, op, "reference")
        ratio = None
        if ours and reference and ours.wall_s and reference.wall_s:
            ratio = reference.wall_s / ours.wall_s
        checks.append(
            Check(
                f"{op} vs reference",
                "-" if ratio is None else f"{ratio:.2f}x",
                f">= {factor:g}x",
                None if ratio is None else ratio >= factor,
            )
        )
    for op in ("save-file", "save-dir", "load-file", "load-dir"):
        ours = _find(results, op, "ours")
        if ours is None or ours.mib_s is None:
            checks.append(Check(f"{op} of the line", "-", f">= {LINE_FRACTION:.0%}", None))
            continue
        line = line_mib_s(rate, ours.connections)
        fraction = ours.mib_s / line
        checks.append(
            Check(
                f"{op} of the line",
                f"{fraction:.0%} of {line:.0f} MiB/s",
                f">= {LINE_FRACTION:.0%} (8-16 connections)",
                fraction >= LINE_FRACTION,
            )
        )
    for op in ("save-bytes", "load-bytes"):
        ours, reference = _find(results, op, "ours"), _find(results, op, "reference")
        met = None
        value = "-"
        if ours and ours.wall_s:
            value = f"{ours.wall_s * 1000:.1f} ms"
            if reference and reference.wall_s:
                value += f" vs {reference.wall_s * 1000:.1f} ms"
                met = ours.wall_s <= reference.wall_s
        checks.append(Check(f"{op} (1 KiB) no slower", value, "<= reference", met))
    worst = [r for r in results if r.client == "ours" and r.peak_rss_mib is not None]
    peak = max(worst, key=lambda r: r.peak_rss_mib or 0.0, default=None)
    checks.append(
        Check(
            "peak RSS, every operation (ours)",
            "-" if peak is None else f"{peak.peak_rss_mib:.0f} MiB ({peak.op})",
            f"< {RSS_LIMIT_MIB:.0f} MiB",
            None if peak is None or peak.peak_rss_mib is None else peak.peak_rss_mib < RSS_LIMIT_MIB,
        )
    )
    return checks


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_report(report: dict[str, Any], results: list[Result], checks: list[Check], out: TextIO) -> None:
    if results:
        _print_results(report, results, out)
    _print_ceiling(report, out)
    if results:
        print_targets(checks, "targets (issue 12)", out)
    machine, load = report["machine"], report["load_average"]
    print(
        f"\nmachine: {machine['cpu']}, {machine['nproc']} CPUs, {machine['memory']}, Linux "
        f"{machine['kernel']}, Python {machine['python']}; load average {load['start']:.2f} at the "
        f"start, {load['end']:.2f} at the end",
        file=out,
    )


def _print_results(report: dict[str, Any], results: list[Result], out: TextIO) -> None:
    config = report["config"]
    print(
        f"\n{config['backend']} on {report['server']} through netshape: {config['rate_mib']:g} MiB/s per "
        f"connection and direction, {config['rtt_ms']:g} ms RTT; {config['size_mib']} MiB, "
        f"median of {config['runs']} fresh-process run(s); 1 KiB: median of {config['bytes_reps']} calls",
        file=out,
    )
    rows: list[list[str]] = []
    for result in results:
        reference = _find(results, result.op, "reference")
        ratio = "-"
        if reference and reference.wall_s and result.wall_s and result.client != "reference":
            ratio = f"{reference.wall_s / result.wall_s:.2f}x"
        small = result.op.endswith("bytes")
        speed = (
            _fmt(None if result.wall_s is None else result.wall_s * 1000) + " ms"
            if small
            else _fmt(result.mib_s)
        )
        connections = result.connections
        line = "-" if small or connections is None else f"{line_mib_s(config['rate_mib'], connections):.0f}"
        rows.append(
            [
                result.op,
                result.client,
                "error" if result.error else speed,
                ratio,
                _fmt(result.peak_rss_mib, 0),
                _fmt(result.requests, 1),
                "-" if connections is None else str(connections),
                line,
                _fmt(result.proxied_mib, 1 if not small else 3),
                result.error or "",
            ]
        )
    print_table(
        rows,
        [
            "operation",
            "client",
            "MiB/s (1 KiB: ms)",
            "vs reference",
            "peak RSS MiB",
            "requests/op",
            "max conns",
            "line MiB/s",
            "MiB via proxy",
            "error",
        ],
        out,
    )
    print(
        "\nratio = reference median time / this client's (above 1: faster than the reference); line = cap x "
        f"connections used, counted as at least {LINE_CONNECTIONS[0]} and at most {LINE_CONNECTIONS[1]}",
        file=out,
    )


def _print_ceiling(report: dict[str, Any], out: TextIO) -> None:
    config, ceiling = report["config"], report.get("ceiling")
    if ceiling and "error" not in ceiling:
        print(
            f"\n{report['server']} unshaped ceiling (boto3, {config['size_mib']} MiB, 8 in flight, "
            "16 MiB parts): "
            f"multipart upload {ceiling['upload_mib_s']:.0f} MiB/s, CompleteMultipartUpload "
            f"{ceiling['complete_s'] * 1000:.0f} ms, ranged GET {ceiling['download_mib_s']:.0f} MiB/s",
            file=out,
        )


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=256, help="file and directory size (default 256)")
    parser.add_argument("--runs", type=int, default=3, help="fresh-process runs per operation (default 3)")
    parser.add_argument("--bytes-reps", type=int, default=10, help="calls per run for 1 KiB (default 10)")
    parser.add_argument("--rate-mib", type=float, default=8.0, help="MiB/s per connection and direction")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="added round-trip time (default 20)")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated: ours,reference,boto3")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a storage option for ours (repeatable; JSON value), e.g. max_concurrency=16",
    )
    parser.add_argument("--backend", choices=("s3", "gcs", "azure"), default="s3")
    parser.add_argument(
        "--server", choices=("s3rver", "moto"), default="s3rver", help="S3 server (default s3rver)"
    )
    parser.add_argument("--install-server", action="store_true", help="npm ci in benchmarks/s3rver if needed")
    parser.add_argument("--install-reference", action="store_true", help="create benchmarks/.venv-reference")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the server's unshaped ceiling")
    parser.add_argument("--ceiling-only", action="store_true", help="only the server's unshaped ceiling")
    parser.add_argument("--json", action="store_true", help="print the full results as JSON on stdout")
    add_json_out(parser)
    args = parser.parse_args(argv)
    args.clients = [c for c in args.clients.split(",") if c]
    args.ops = [o for o in args.ops.split(",") if o]
    unknown = [c for c in args.clients if c not in CLIENTS] + [o for o in args.ops if o not in OPS]
    if unknown:
        parser.error(f"unknown client or operation: {', '.join(unknown)}")
    if args.backend != "s3":
        args.clients = ["ours"]  # the reference and boto3 are measured on S3 only
        args.no_ceiling = True
    if args.size_mib < 1 or args.runs < 1 or args.bytes_reps < 1:
        parser.error("--size-mib, --runs and --bytes-reps must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    run_dir = new_run_dir("objectstore")
    with terminate_as_interrupt():
        try:
            return _main(args, run_dir, out, argv)
        finally:
            remove(run_dir)


def _main(args: argparse.Namespace, run_dir: Path, out: TextIO, argv: Sequence[str] | None) -> int:
    load_start = os.getloadavg()[0]
    ours = find_ours()
    reference = find_reference(args.install_reference, "reference" in args.clients)
    clients = list(args.clients)
    if "reference" in clients and not reference.available:
        log(f"reference SDK unavailable: {reference.reason}")
        clients.remove("reference")
    boto3_python = Interpreter("boto3", ours.python, "boto3")
    runner = Runner(run_dir, {"ours": ours, "reference": reference, "boto3": boto3_python}, WORKER)
    datasets: dict[str, Dataset] = {}
    kinds = {_kind(op) for op in args.ops} | ({"file"} if not args.no_ceiling else set())
    if "file" in kinds:
        datasets["file"] = make_file_dataset(args.size_mib)
    if "dir" in kinds:
        datasets["dir"] = make_dir_dataset(args.size_mib)
    if "bytes" in kinds:
        datasets["bytes"] = make_bytes_dataset()

    start = s3_target if args.backend == "s3" else emulator_target
    with start(args, run_dir) as (target, proxy):
        ceiling = None if args.no_ceiling else measure_ceiling(runner, target, datasets["file"])
        results = (
            [] if args.ceiling_only else measure(runner, target, proxy, datasets, clients, args.ops, args)
        )
        server_name = target.server_name
    checks = evaluate(results, args.rate_mib)
    report: dict[str, Any] = {
        "machine": describe_machine(DATA_ROOT),
        "load_average": {"start": load_start, "end": os.getloadavg()[0]},
        "server": server_name,
        "config": {
            "backend": args.backend,
            "rate_mib": args.rate_mib,
            "rtt_ms": args.rtt_ms,
            "size_mib": args.size_mib,
            "runs": args.runs,
            "bytes_reps": args.bytes_reps,
            "clients": clients,
        },
        "reference_version": reference.version,
        "ceiling": ceiling,
        "results": [result.summary() for result in results],
        "targets": [
            {"name": c.name, "value": c.value, "threshold": c.threshold, "met": c.met} for c in checks
        ],
    }
    print_report(report, results, checks, out)
    if args.json:
        print(json.dumps(report, indent=2))
    write_json_out(args.json_out, "benchmarks/objectstore.py", argv, report)
    return 1 if any(r.error for r in results if r.client == "ours") else 0


if __name__ == "__main__":
    sys.exit(main())
