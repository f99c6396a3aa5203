"""Cold start on S3: a fresh process's ``Checkpoint(...)`` and first 1 KiB save, beside boto3's.

A task that checkpoints pays, once per attempt, for importing this package and its store's
client and for building the client before the first byte moves. This measures that cost the way
a task pays it: each run is a fresh interpreter that imports, constructs and saves 1 KiB to a
new key, and the same for a plain boto3 ``put_object`` of 1 KiB, alternating, on the same S3
server (the test suite's moto by default). It prints the medians, the ratio ours / boto3, and
which store clients the saving process imported (only ``s3fs`` belongs there).

    python benchmarks/cold_start.py                  # moto, 5 runs each
    python benchmarks/cold_start.py --server s3rver --install-server --runs 10

Times are wall clock on whatever else the machine is doing; the ratio, measured in the same run
with the two kinds of process alternating, is the figure to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks import s3server
from benchmarks.lib.report import add_json_out, log, write_json_out

REPO = Path(__file__).resolve().parent.parent
STORE_CLIENTS = ("s3fs", "gcsfs", "adlfs")
PAYLOAD_BYTES = 1024

# Each program prints one JSON line: seconds from its first statement to after the import, the
# construction and the upload, and the store clients it imported.
OURS = """
import time
started = time.perf_counter()
import json, sys
from flyte_checkpoint import Checkpoint
imported = time.perf_counter()
uri, options = sys.argv[1], json.loads(sys.argv[2])
checkpoint = Checkpoint(uri, storage_options=options)
constructed = time.perf_counter()
checkpoint.save_sync(bytes(1024))
saved = time.perf_counter()
checkpoint.close()
clients = sorted({name.split(".")[0] for name in sys.modules} & {"s3fs", "gcsfs", "adlfs"})
print(json.dumps({"import_s": imported - started, "construct_s": constructed - imported,
                  "save_s": saved - constructed, "total_s": saved - started, "clients": clients}))
"""
BOTO3 = """
import time
started = time.perf_counter()
import json, sys
import boto3
imported = time.perf_counter()
endpoint, key, secret, bucket, name = sys.argv[1:6]
client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                      region_name="us-east-1")
constructed = time.perf_counter()
client.put_object(Bucket=bucket, Key=name, Body=bytes(1024))
saved = time.perf_counter()
print(json.dumps({"import_s": imported - started, "construct_s": constructed - imported,
                  "save_s": saved - constructed, "total_s": saved - started, "clients": []}))
"""


def run_program(program: str, arguments: list[str]) -> dict[str, Any]:
    """Run ``program`` in a fresh interpreter; its figures plus the whole process's wall time."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", program, *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    process_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"a cold-start run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**figures, "process_s": process_s}


def measure(server: s3server.S3Server, runs: int) -> dict[str, list[dict[str, Any]]]:
    """``runs`` cold processes of each client, alternating, each writing a new key."""
    options = {
        "endpoint_url": server.endpoint,
        "key": server.key,
        "secret": server.secret,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "boto3": []}
    for run in range(runs):
        name = f"cold-start/{uuid.uuid4().hex}"
        results["ours"].append(run_program(OURS, [f"s3://{server.bucket}/{name}-ours", json.dumps(options)]))
        arguments = [server.endpoint, server.key, server.secret, server.bucket, f"{name}-boto3"]
        results["boto3"].append(run_program(BOTO3, arguments))
        log(
            f"run {run + 1}/{runs}: ours {results['ours'][-1]['total_s']:.2f} s, "
            f"boto3 {results['boto3'][-1]['total_s']:.2f} s"
        )
    return results


FIGURES = ("import_s", "construct_s", "save_s", "total_s", "process_s")


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {
        client: {figure: statistics.median(run[figure] for run in runs) for figure in FIGURES}
        for client, runs in results.items()
    }
    ratios = {
        figure: medians["ours"][figure] / medians["boto3"][figure] for figure in ("total_s", "process_s")
    }
    clients = sorted({name for run in results["ours"] for name in run["clients"]})
    return {"medians": medians, "ratio_ours_to_boto3": ratios, "store_clients_imported": clients}


def print_report(report: dict[str, Any]) -> None:
    summary = report["summary"]
    print(
        f"Cold start on {report['server']}: fresh process, first {PAYLOAD_BYTES} B upload, "
        f"median of {report['runs']} runs (load average {report['load_average']})"
    )
    print(f"{'':8}" + "".join(f"{figure.removesuffix('_s'):>11}" for figure in FIGURES))
    for client, medians in summary["medians"].items():
        print(f"{client:8}" + "".join(f"{medians[figure]:>10.3f}s" for figure in FIGURES))
    ratios = summary["ratio_ours_to_boto3"]
    print(
        f"ours / boto3: {ratios['total_s']:.2f}x in-process (import to upload done), "
        f"{ratios['process_s']:.2f}x whole process"
    )
    print(f"store clients imported by our saving process: {', '.join(summary['store_clients_imported'])}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cold processes per client (default 5)")
    parser.add_argument(
        "--server", choices=("moto", "s3rver"), default="moto", help="S3 server (default moto)"
    )
    parser.add_argument("--install-server", action="store_true", help="npm ci s3rver first if needed")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    add_json_out(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="cold-start-") as run_dir,
        s3server.running(args.server, "cold-start", args.install_server, Path(run_dir)) as server,
    ):
        results = measure(server, args.runs)
    report = {
        "server": args.server,
        "runs": args.runs,
        "load_average": [round(value, 2) for value in os.getloadavg()],
        "results": results,
        "summary": summarise(results),
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    write_json_out(args.json_out, "cold_start.py", argv, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
