"""``examples/preemptible_training.py`` run as a user runs it: each preempted attempt saves the
step it reached, and the next resumes there; the run finishes without spending a user retry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "preemptible_training.py"


def test_every_preempted_attempt_resumes_at_the_step_it_saved_and_the_run_finishes() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "40", "--save-every", "15", "--preemptions", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    saved = [int(step) for step in re.findall(r"preempted after step (\d+), saved it", result.stdout)]
    resumed = [int(step) for step in re.findall(r"resumed at step (\d+)", result.stdout)]
    assert len(saved) == 2
    assert resumed == saved  # no step lost
    assert "finished all 40 steps" in result.stdout
    assert "result: 40" in result.stdout
