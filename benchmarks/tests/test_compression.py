"""``benchmarks/compression.py`` still runs, at a tiny size.

Not a timed test: it checks that every figure is produced, never what the figures are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "compression.py"


def test_the_compression_benchmark_reports_every_figure(tmp_path: Path) -> None:
    sizes = ["--size-mib", "8", "--text-mib", "1", "--half-mib", "4"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *sizes, "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, f"compression.py failed:\n{done.stderr[-4000:]}"
    report, figures = done.stdout.split("\n{", 1)
    lines = ("save   ours", "wall ratio", "load   ours", "load   weights", "load   half", "load   text")
    for line in (*lines, "text   "):
        assert line in report
    values = json.loads("{" + figures)
    expected = {"save_cpu", "tar_save_cpu", "weights_load_wall_1", "weights_load_wall_2", "text_size"}
    assert expected | {"half_load_model_16", "text_today"} <= set(values)
    assert all(value >= 0 for value in values.values())
    assert list(tmp_path.iterdir()) == []  # its data is removed
