"""``benchmarks/incremental.py`` still runs: its smoke size, plain and incremental saves.

Not a timed test: it checks that every figure is produced, and the one figure that does not
depend on timing: incremental saves move less than plain ones of the same growing directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "incremental.py"


def test_the_incremental_benchmark_reports_every_figure(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, f"incremental.py failed:\n{done.stderr[-4000:]}"
    plain, incremental = json.loads(done.stdout)["results"]
    for result in (plain, incremental):
        assert len(result["walls_s"]) == 3
        assert result["last_over_first"] > 0
        assert result["stored_bytes"] >= result["directory_bytes"]
    assert incremental["moved_bytes"] < plain["moved_bytes"]
