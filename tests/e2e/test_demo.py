"""The README's demo: a task that fails on purpose and resumes from its checkpoint each retry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "resume_counter.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_demo_resumes_from_each_checkpoint_and_reaches_the_end(tmp_path: Path) -> None:
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stderr
    resumed = [int(v) for v in re.findall(r"resumed from checkpoint at (\d+)", result.stdout)]
    assert resumed == [6, 12, 18]
    assert "attempt 0: no checkpoint, starting at 0" in result.stdout
    assert result.stdout.strip().endswith("result: 20")


def test_the_demo_keeps_checkpoints_under_the_current_directory_by_default(tmp_path: Path) -> None:
    run_demo(tmp_path, "-n", "5", "--fail-every", "2")
    (run_dir,) = (tmp_path / "flyte-checkpoints").iterdir()
    assert (run_dir / "checkpoint").read_bytes() == b"5"


def test_a_second_demo_run_starts_from_zero_again(tmp_path: Path) -> None:
    run_demo(tmp_path, "-n", "5", "--fail-every", "2")
    result = run_demo(tmp_path, "-n", "5", "--fail-every", "2")
    assert "attempt 0: no checkpoint, starting at 0" in result.stdout


def test_the_demo_fails_loudly_when_retries_run_out(tmp_path: Path) -> None:
    result = run_demo(tmp_path, "-n", "20", "--fail-every", "5", "--retries", "1")
    assert result.returncode == 1
    assert "PlannedFailure: planned failure at 10" in result.stderr
