"""The README's Ray example, run as a script on its own local Ray instance."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_example_saves_actors_survives_a_dead_one_and_restores_fresh_ones(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "ray_state.py"), "--storage", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "saved version" in result.stdout
    assert "a save with a dead actor failed at once: part 1 (CheckpointPartError)" in result.stdout
    assert "committed checkpoint still: step 1000" in result.stdout
    assert "metadata: {'step': 1000}" in result.stdout
    assert "controller: produced [0, 1, 2]" in result.stdout
    for index in range(3):
        assert f"unit {index}: {index}=sample-{index}" in result.stdout
