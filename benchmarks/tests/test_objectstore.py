"""The object-store benchmark still runs end to end: tiny, ours only, moto behind the proxy.

Not a timed test: it checks that every figure is produced, never what the figures are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.tests.json_out import assert_json_out_is_the_report

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "objectstore.py"
OPERATIONS = ["save-file", "save-dir", "save-bytes", "load-file", "load-dir", "load-bytes"]


def run_benchmark(*options: str) -> dict[str, Any]:
    """Run the benchmark tiny (moto, 64 MiB/s, 2 ms, one run, no ceiling) and parse its JSON."""
    command = [
        sys.executable,
        str(SCRIPT),
        "--server=moto",
        "--runs=1",
        "--rate-mib=64",
        "--rtt-ms=2",
        "--no-ceiling",
        "--json",
        *options,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=str(REPO))
    assert done.returncode == 0, f"objectstore.py failed:\n{done.stderr[-4000:]}"
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


@pytest.fixture(scope="module")
def json_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("objectstore-json") / "report.json"


@pytest.fixture(scope="module")
def report(json_out: Path) -> dict[str, Any]:
    return run_benchmark("--clients=ours", "--size-mib=1", "--bytes-reps=1", "--json-out", str(json_out))


@pytest.mark.parametrize("op", OPERATIONS)
def test_the_benchmark_measures_each_operation_of_ours_through_the_proxy(
    report: dict[str, Any], op: str
) -> None:
    [result] = [r for r in report["results"] if r["op"] == op and r["client"] == "ours"]
    assert result["error"] is None
    assert result["mib_s"] > 0
    assert result["peak_rss_mib"] > 0
    assert result["requests_per_op"] >= 1, "the proxy saw no request: the client bypassed it"
    assert result["peak_connections"] >= 1


def test_the_benchmark_reports_every_target_of_the_issue(report: dict[str, Any]) -> None:
    names = {target["name"] for target in report["targets"]}
    assert {"save-file vs reference", "load-dir of the line", "peak RSS, every operation (ours)"} <= names
    assert report["config"]["rate_mib"] == 64
    assert report["server"] == "moto"


def test_the_benchmark_measures_botocores_own_1_kib_requests_through_the_proxy() -> None:
    report = run_benchmark("--clients=boto3", "--ops=save-bytes,load-bytes", "--bytes-reps=2")
    results = {r["op"]: r for r in report["results"] if r["client"] == "boto3"}
    assert sorted(results) == ["load-bytes", "save-bytes"]
    for result in results.values():
        assert result["error"] is None
        assert result["requests_per_op"] == 1  # one PutObject or GetObject per call


def test_json_out_writes_the_printed_report_and_the_command_line(
    report: dict[str, Any], json_out: Path
) -> None:
    assert_json_out_is_the_report(report, json_out, "benchmarks/objectstore.py")
