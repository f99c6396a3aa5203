"""``benchmarks/incremental.py`` still runs: its smoke size, plain and incremental saves.

Not a timed test: it checks that every figure is produced, and the one figure that does not
depend on timing: incremental saves move less than plain ones of the same growing directory.
"""

from __future__ import annotations

import json

from tests.benchmark_runs import run_benchmark


def test_the_incremental_benchmark_reports_every_figure() -> None:
    done = run_benchmark("incremental.py", "--smoke", "--json", timeout=300)
    assert done.returncode == 0, f"incremental.py failed:\n{done.stderr[-4000:]}"
    plain, incremental = json.loads(done.stdout)["results"]
    for result in (plain, incremental):
        assert len(result["walls_s"]) == 3
        assert result["last_over_first"] > 0
        assert result["stored_bytes"] >= result["directory_bytes"]
    assert incremental["moved_bytes"] < plain["moved_bytes"]
