"""The preemption benchmark still runs: ``benchmarks/preemption.py --quick`` on local disk.

Not a timed test and not a check of the targets (they are measured, at full size, by running the
script; ``--report-only`` keeps a target a tiny run misses from failing it): it checks that every
configuration, issue 29's scenarios included, is run and preempted, that each preemption is
reported with every figure the issues ask for, and that the report names the machine and every
target.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import preemption as benchmark
from benchmarks.lib.targets import Check
from benchmarks.tests.json_out import assert_json_out_is_the_report

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "preemption.py"

PREEMPTIONS = 2
SCENARIOS = {"in-place", "fork-children", "long-c-call", "startup-load"}
"""The scenarios on local disk (``s3-background-then-notice`` is S3's only)."""
CONFIGURATIONS = {
    "local/oneline/G=2x",
    "local/oneline/G=2x+margin",
    "local/oneline/G=0.5x",
    "local/nochange/G=2x",
    "local/nochange/G=2x+margin",
    "local/nochange/G=0.5x",
    "local/reference/G=2x",
} | {f"local/{scenario}/G=2x+margin" for scenario in SCENARIOS}
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
PER_SCENARIO_PREEMPTION = {"situation", "called", "called_kept", "late", "hang", "children_left"}


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
            f"--preemptions={PREEMPTIONS}",
            "--scenario-preemptions=1",
            "--report-only",
            "--storage=local",
            "--no-ranks",
            "--json",
            "--json-out",
            str(json_out),
        ],
        capture_output=True,
        text=True,
        timeout=420,
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
        wanted = "preemptions" if configuration["scenario"] == "plain" else "scenario_preemptions"
        assert configuration["preemptions"] >= report["config"][wanted], name
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


def test_each_scenario_reports_issue_29s_targets(report: dict[str, Any]) -> None:
    names = {target["name"] for target in report["targets"]}
    for scenario in SCENARIOS:
        configuration = f"local/{scenario}/G=2x+margin"
        assert report["storages"]["local"]["scenarios"][scenario]["save_s"] > 0, scenario
        for target in (
            "hangs",
            "steps lost per preemption, from the first save on",
            "saves called before the notice kept",
            "corrupt, mixed or unreadable checkpoints",
        ):
            assert f"{configuration}: {target}" in names
        assert any(name.startswith(f"{configuration}: SIGKILLs (G = ") for name in names), scenario
        assert any(name.startswith(f"{configuration}: SIGTERMs during ") for name in names), scenario


def test_each_scenario_preemption_says_where_the_sigterm_landed_and_what_it_kept(
    report: dict[str, Any],
) -> None:
    for configuration in report["configurations"]:
        if configuration["scenario"] == "plain":
            continue
        for preemption in configuration["per_preemption"]:
            assert set(preemption) >= PER_SCENARIO_PREEMPTION, configuration["name"]
            assert preemption["situation"] is not None, configuration["name"]
            if preemption["called"] is not None:
                assert preemption["called_kept"] is not None, configuration["name"]


def test_a_target_not_met_fails_the_run_unless_report_only() -> None:
    met, missed = Check("a", "0", "0", True), Check("b", "1", "0", False)
    nothing = Check("c", "-", "0", None)
    assert benchmark.exit_status([], [met, nothing], report_only=False) == 0
    assert benchmark.exit_status([], [met, missed], report_only=False) == 1
    assert benchmark.exit_status([], [met, missed], report_only=True) == 0


def test_json_out_writes_the_printed_report_and_the_command_line(
    report: dict[str, Any], json_out: Path
) -> None:
    assert_json_out_is_the_report(report, json_out, "benchmarks/preemption.py")
