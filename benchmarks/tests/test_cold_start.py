"""``benchmarks/cold_start.py`` still runs: one cold process of each client on moto.

Not a timed test: it checks that every figure is produced and that our saving process imported
the S3 client only, never what the figures are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.tests.json_out import assert_json_out_is_the_report

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cold_start.py"


def test_the_cold_start_benchmark_reports_every_figure_for_both_clients(tmp_path: Path) -> None:
    json_out = tmp_path / "cold_start.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--json", "--json-out", str(json_out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, f"cold_start.py failed:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    summary = report["summary"]
    for client in ("ours", "boto3"):
        for figure in ("import_s", "construct_s", "save_s", "total_s", "process_s"):
            assert summary["medians"][client][figure] > 0, f"{client}: {figure}"
    assert summary["ratio_ours_to_boto3"]["total_s"] > 0
    assert summary["store_clients_imported"] == ["s3fs"]
    assert_json_out_is_the_report(report, json_out, "cold_start.py")
