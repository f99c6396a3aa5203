"""The preemption benchmark still runs: ``benchmarks/preemption.py --quick`` on local disk.

Not a timed test and not a check of the targets (they are measured, at full size, by running the
script): it checks that every configuration is run and preempted, that each preemption is
reported with every figure the issue asks for, and that the report names the machine and every
target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.json_out import assert_json_out_is_the_report

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "preemption.py"
CONFIGURATIONS = {
    "local/oneline/G=2x",
    "local/oneline/G=2x+margin",
    "local/oneline/G=0.5x",
    "local/nochange/G=2x",
    "local/nochange/G=2x+margin",
    "local/nochange/G=0.5x",
    "local/reference/G=2x",
}
PER_PREEMPTION = {
    "at_sigterm",
    "in_flight",
    "steps_done",
    "exit",
    "resumed",
    "verdict",
    "steps_lost",
    "committed_in_grace",
    "previous_survived",
    "wasted_s",
}


@pytest.fixture(scope="module")
def json_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("preemption-json") / "report.json"


@pytest.fixture(scope="module")
def report(json_out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--storage=local",
            "--no-ranks",
            "--json",
            "--json-out",
            str(json_out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(REPO),
    )
    assert done.returncode == 0, f"preemption.py --quick failed:\n{done.stderr[-4000:]}"
    parsed: dict[str, Any] = json.loads(done.stdout)
    return parsed


def test_every_configuration_is_run_and_preempted(report: dict[str, Any]) -> None:
    configurations = {c["name"]: c for c in report["configurations"]}
    assert set(configurations) == CONFIGURATIONS
    for name, configuration in configurations.items():
        assert configuration["error"] is None, f"{name}: {configuration['error']}"
        assert configuration["preemptions"] >= report["config"]["preemptions"], name
        assert configuration["runs_started"] >= 1, name


def test_each_preemption_reports_what_it_lost_and_whether_a_save_committed_in_grace(
    report: dict[str, Any],
) -> None:
    for configuration in report["configurations"]:
        for preemption in configuration["per_preemption"]:
            assert set(preemption) >= PER_PREEMPTION, configuration["name"]
            assert preemption["verdict"] != "?", f"{configuration['name']}: a preemption never completed"
            assert preemption["steps_lost"] == preemption["steps_done"] - preemption["resumed"]
            assert preemption["wasted_s"] >= 0


def test_the_report_names_the_machine_the_scale_and_every_target(report: dict[str, Any]) -> None:
    machine = report["machine"]
    assert machine["nproc"] >= 1
    assert machine["cpu"]
    assert machine["python"]
    assert machine["torch"]
    local = report["storages"]["local"]
    assert local["save_s"] > 0
    assert {"step_s", "every", "extra_mib", "run_steps", "delay_s"} <= set(local["scale"])
    names = [target["name"] for target in report["targets"]]
    assert "local/oneline/G=2x: steps lost per preemption" in names
    assert "local/oneline/G=2x: a save committed inside the grace period" in names
    assert "local/nochange/G=2x: the in-flight background save survives" in names
    assert "local/oneline/G=0.5x (G < one save): the previous checkpoint survives" in names
    assert "local/nochange/G=0.5x (G < one save): every run finishes" in names
    assert "local: corrupt, mixed or unreadable checkpoints (ours)" in names


def test_json_out_writes_the_printed_report_and_the_command_line(
    report: dict[str, Any], json_out: Path
) -> None:
    assert_json_out_is_the_report(report, json_out, "benchmarks/preemption.py")
