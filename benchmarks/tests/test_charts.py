"""``benchmarks/charts.py``: the committed charts are what the committed results render to, and
their figures come from those results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import charts


def test_the_committed_charts_are_what_the_committed_results_render_to() -> None:
    problems = charts.check(charts.RESULTS, charts.CHARTS)
    assert problems == [], "run `python benchmarks/charts.py` and commit docs/assets/charts/:\n" + "\n".join(
        problems
    )


def test_every_committed_chart_is_one_the_script_renders() -> None:
    names = {chart.name for chart in charts.CHART_LIST}
    assert {path.name for path in charts.CHARTS.glob("*.svg")} == names


def test_a_changed_result_changes_the_figure_drawn(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(charts.RESULTS, results)
    report = json.loads((results / "compare.json").read_text())
    (entry,) = [r for r in report["results"] if r["op"] == "save-dir-sync" and r["impl"] == "ours"]
    entry["throughput_mib_s"] = 12345.6
    (results / "compare.json").write_text(json.dumps(report))
    (chart,) = [c for c in charts.CHART_LIST if c.name == "local-throughput.svg"]
    svg = charts.render(chart, results)
    assert svg is not None
    assert b"12,346 MiB/s" in svg


def test_a_chart_whose_results_are_missing_is_not_rendered(tmp_path: Path) -> None:
    written = charts.render_all(tmp_path / "no-results", tmp_path / "out")
    assert written == []
