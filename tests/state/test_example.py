"""The README's multi-part example: a coordinator and four rank processes, run as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_example_saves_four_ranks_and_a_coordinator_and_restores_them(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "multipart_ranks.py"), "--storage", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.findall(r"rank (\d): wrote part \1: \d+ bytes", result.stdout) == ["0", "1", "2", "3"]
    assert "coordinator: step 1000, learning rate 0.0003" in result.stdout
    assert "metadata: {'step': 1000}" in result.stdout
    restored = re.findall(r"rank (\d): restored weights \[(.*)\]", result.stdout)
    assert restored == [(str(rank), f"{rank + 1}.0, {rank + 1}.1, {rank + 1}.2") for rank in range(4)]
