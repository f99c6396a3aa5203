"""Measurement workers: each operation runs in a fresh process (``benchmarks/_worker.py`` or a
script wrapping it) under an implementation's own interpreter, ours or the reference SDK's cached
venv, inside one private run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib.data import remove
from benchmarks.lib.report import log

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent
WORKER = HERE / "_worker.py"
REFERENCE_VENV = HERE / ".venv-reference"
REFERENCE_REQUIREMENT = "flyte==2.12.1"
REFERENCE_VERSION = "2.12.1"
WORKER_TIMEOUT_S = 1800


@dataclass
class Interpreter:
    name: str
    python: str | None
    version: str | None = None
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.python is not None


def _probe(python: str, code: str) -> str | None:
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(HERE)
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_ours() -> Interpreter:
    code = "import flyte_checkpoint; print(flyte_checkpoint.__version__)"
    for python in (sys.executable, str(REPO / ".venv" / "bin" / "python")):
        if Path(python).exists() and (version := _probe(python, code)):
            return Interpreter("ours", python, version)
    raise SystemExit("cannot import flyte_checkpoint: run from the project's venv (pip install -e .)")


def _reference_python() -> Path:
    return REFERENCE_VENV / "bin" / "python"


def find_reference(install: bool, wanted: bool) -> Interpreter:
    if not wanted:
        return Interpreter("reference", None, reason="not requested (--no-reference, or --smoke)")
    code = "import flyte, importlib.metadata as m; print(m.version('flyte'))"
    python = _reference_python()
    version = _probe(str(python), code) if python.exists() else None
    if install and version != REFERENCE_VERSION:
        failure = install_reference()
        if failure:
            return Interpreter("reference", None, reason=failure)
        version = _probe(str(python), code)
    if version is None:
        reason = (
            f"{REFERENCE_VENV} cannot import flyte"
            if python.exists()
            else f"not installed (run with --install-reference to create {REFERENCE_VENV})"
        )
        return Interpreter("reference", None, reason=reason)
    interpreter = Interpreter("reference", str(python), version)
    if version != REFERENCE_VERSION:
        interpreter.reason = f"flyte {version} installed, figures were specified for {REFERENCE_VERSION}"
    return interpreter


def install_reference() -> str | None:
    """Create the cached venv and install the reference SDK; return why it failed, or None."""
    log(f"installing {REFERENCE_REQUIREMENT} into {REFERENCE_VENV} ...")
    steps = [
        [sys.executable, "-m", "venv", str(REFERENCE_VENV)],
        [
            str(_reference_python()),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            REFERENCE_REQUIREMENT,
        ],
    ]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(step)}` failed: {exc}"
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            return f"`{' '.join(step)}` exited {done.returncode}: {tail}"
    return None


@dataclass
class Storage:
    """Where objects go: local disk under the run directory, or a bucket on the S3 server."""

    name: str
    base: str
    storage_options: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def uri(self, impl: str, name: str) -> str:
        return f"{self.base}/{impl}/{name}"


class Runner:
    """Runs worker processes and physical references inside one private run directory."""

    def __init__(self, run_dir: Path, interpreters: dict[str, Interpreter], worker: Path = WORKER) -> None:
        self.run_dir = run_dir
        self.worker_script = worker
        self.tmp = run_dir / "tmp"
        self.interpreters = interpreters
        self.produced: set[tuple[str, str, str]] = set()

    def _fresh_tmp(self) -> None:
        remove(self.tmp)
        self.tmp.mkdir(parents=True)

    def worker(self, impl: str, spec: dict[str, Any], storage: Storage) -> dict[str, Any]:
        python = self.interpreters[impl].python
        assert python is not None
        self._fresh_tmp()
        env = {**os.environ, **storage.env, "TMPDIR": str(self.tmp)}
        if impl != "ours":
            # The reference must not import this checkout. Ours keeps the caller's PYTHONPATH: a
            # worktree sharing another checkout's venv (an editable install) measures its own code.
            env.pop("PYTHONPATH", None)
        spec = {**spec, "impl": impl, "storage_options": storage.storage_options}
        os.sync()  # settle dirty pages left by the previous run (the reference does not fsync)
        try:
            done = subprocess.run(
                [python, str(self.worker_script), json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=WORKER_TIMEOUT_S,
                env=env,
                cwd=str(self.run_dir),
            )
        finally:
            remove(self.tmp)
        lines = done.stdout.strip().splitlines()
        try:
            result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        except ValueError:
            result = {}
        if done.returncode != 0 or not result or "error" in result:
            message = result.get("error") or f"worker exited {done.returncode}"
            detail = result.get("traceback") or done.stderr[-2000:]
            raise WorkerError(f"{impl} {spec['op']}-{spec['kind']}-{spec['mode']}: {message}\n{detail}")
        return result

    def timed_command(self, command: Sequence[str], before: Callable[[], None] | None = None) -> float:
        if before is not None:
            before()
        os.sync()
        started = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return time.perf_counter() - started


class WorkerError(RuntimeError):
    pass


def object_name(kind: str) -> str:
    return {"dir": "dir.tar.gz", "file": "file.bin", "bytes": "payload.bin"}[kind]
