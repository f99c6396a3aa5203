"""The benchmark script still runs: ``benchmarks/compare.py --smoke --json`` on tiny data.

This is not a timed test: it checks that every figure is produced for our implementation, never
what the figures are.
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
SCRIPT = REPO / "benchmarks" / "compare.py"

OPERATIONS = [
    f"{op}-{kind}-{mode}"
    for op in ("save", "load")
    for kind in ("bytes", "file", "dir")
    for mode in ("sync", "async")
] + ["save-background-dir-sync", "save-background-dir-async"]
FIGURES = [
    "wall_min_s",
    "wall_median_s",
    "throughput_mib_s",
    "peak_rss_mib",
    "rss_before_mib",
    "peak_temp_bytes",
]
PHYSICAL = ["tar -cf (directory)", "tar -xf (directory, uncompressed tar)", "cp (file)"]


@pytest.fixture(scope="module")
def json_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compare-json") / "report.json"


@pytest.fixture(scope="module")
def report(json_out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", "--json-out", str(json_out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
    )
    assert done.returncode == 0, f"compare.py --smoke failed:\n{done.stderr[-4000:]}"
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def _ours(report: dict[str, Any], op: str) -> dict[str, Any]:
    matches = [
        r for r in report["results"] if r["op"] == op and r["impl"] == "ours" and r["storage"] == "local"
    ]
    assert len(matches) == 1, f"{op}: expected one result for ours, got {len(matches)}"
    found: dict[str, Any] = matches[0]
    return found


@pytest.mark.parametrize("op", OPERATIONS)
def test_every_figure_for_our_operations(report: dict[str, Any], op: str) -> None:
    result = _ours(report, op)
    assert result["error"] is None
    assert len(result["runs"]) == 1
    for figure in FIGURES:
        value = result[figure]
        assert isinstance(value, int | float), f"{op}: {figure} missing"
        assert value >= 0, f"{op}: {figure} is {value}"
    if op.endswith("-async"):
        assert isinstance(result["stall_ms"], float), f"{op}: stall_ms missing"
        assert isinstance(result["stall_cpu_ms"], float), f"{op}: stall_cpu_ms missing"
    if "background" in op:
        assert isinstance(result["blocked_s"], float), f"{op}: blocked_s missing"


def test_loads_restore_exactly_what_was_saved(report: dict[str, Any]) -> None:
    for kind in ("bytes", "file", "dir"):
        run = _ours(report, f"load-{kind}-sync")["runs"][0]
        assert run["digest"] == report["data"][kind]["digest"], f"load-{kind}-sync restored other content"


def test_physical_references_and_format_check(report: dict[str, Any]) -> None:
    names = {physical["name"]: physical for physical in report["physical"]}
    for name in PHYSICAL:
        assert isinstance(names[name]["wall_median_s"], float), f"{name} missing"
    checks = {check["name"]: check["ok"] for check in report["compat"]}
    assert checks.get("tar -xzf reads our directory object (same tree)") is True


def test_report_describes_machine_and_targets(report: dict[str, Any]) -> None:
    assert report["machine"]["nproc"] >= 1
    assert report["config"]["smoke"] is True
    names = [target["name"] for target in report["targets"]]
    assert "peak RSS, any of our local operations" in names
    assert "longest event-loop stall in await save()/load()" in names
    assert any(name.startswith("background save") for name in names)


def test_json_out_writes_the_printed_report_and_the_command_line(
    report: dict[str, Any], json_out: Path
) -> None:
    assert_json_out_is_the_report(report, json_out, "benchmarks/compare.py")
