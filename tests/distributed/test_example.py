"""The README's multi-node example: 4 FSDP ranks, one SIGKILLed mid-run, resumed on 2 ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_example_resumes_on_two_ranks_from_the_last_step_four_ranks_committed(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            str(REPO / "examples" / "dcp_resume.py"),
            "--storage",
            str(tmp_path / "ck"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    killed_after = int(
        re.findall(r"killing rank 1 with SIGKILL after step (\d+) was committed", result.stdout)[0]
    )
    resumed = int(re.findall(r"2 ranks: resumed from step (\d+)", result.stdout)[0])
    assert resumed >= killed_after >= 3
    assert re.findall(r"2 ranks: step (\d+) loss", result.stdout) == [
        str(step) for step in range(resumed + 1, 9)
    ]
    # Retention keeps the newest two steps and, until the run ends, the step it resumed from.
    assert f"2 ranks: done at step 8; committed steps [{resumed}, 7, 8]" in result.stdout


def test_the_example_trains_and_saves_under_torchrun(tmp_path: Path) -> None:
    """The launcher Flyte's Elastic plugin runs: torchrun sets RANK, WORLD_SIZE and the rendezvous."""
    command = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(REPO / "examples" / "dcp_resume.py"), "train"]
    command += ["--storage", str(tmp_path / "ck"), "--steps", "2"]
    result = subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "2 ranks: starting fresh" in result.stdout
    assert "2 ranks: done at step 2; committed steps [1, 2]" in result.stdout
