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
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--size-mib", "8", "--text-mib", "1", "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, f"compression.py failed:\n{done.stderr[-4000:]}"
    report, figures = done.stdout.split("\n{", 1)
    for line in ("save   ours", "wall ratio", "load   ours", "load   weights", "load   text", "text   "):
        assert line in report
    values = json.loads("{" + figures)
    assert {"save_cpu", "tar_save_cpu", "load_wall_1", "load_wall_2", "text_size", "text_today"} <= set(
        values
    )
    assert all(value >= 0 for value in values.values())
    assert list(tmp_path.iterdir()) == []  # its data is removed
