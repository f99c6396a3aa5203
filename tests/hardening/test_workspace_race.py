"""Workspaces created while other threads and processes sweep abandoned ones never fail."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint

HELPERS_PER_THREAD = 60
THREADS = 8


def open_and_close_helpers(dest: Path, errors: list[BaseException]) -> None:
    for _ in range(HELPERS_PER_THREAD):
        try:
            with Checkpoint(dest, dest) as helper:
                helper.load_sync()
        except BaseException as error:  # collected for the assertion in the test's thread
            errors.append(error)


def test_eight_threads_making_fresh_helpers_at_once_never_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    dest = tmp_path / "ckpt"
    Checkpoint(dest).save_sync(b"state")
    errors: list[BaseException] = []
    threads = [threading.Thread(target=open_and_close_helpers, args=(dest, errors)) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_processes_making_fresh_helpers_at_once_never_fail(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    Checkpoint(dest).save_sync(b"state")
    program = (
        "import sys\nfrom flyte_checkpoint import Checkpoint\n"
        "for _ in range(100):\n"
        "    with Checkpoint(sys.argv[1], sys.argv[1]) as helper:\n"
        "        helper.load_sync()\n"
    )
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(dest)], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    failures = []
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        if worker.returncode:
            failures.append(stderr[-2000:])
    assert failures == []
