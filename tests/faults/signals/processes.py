"""Running a test program as a real process, aiming a real signal at it, and always reaping it."""

from __future__ import annotations

import codecs
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.faults.signals.programs import STORAGE_OPTIONS_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]
READY_TIMEOUT = 60.0
"""Seconds a program may take to import everything and say ``ready`` (CI machines stall)."""
HANG_TIMEOUT = 20.0
"""Seconds after which a program that should have ended is taken to hang."""


class Program:
    """A started program: its process, and what it printed so far."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._scanned = 0
        """Lines :meth:`wait_for_line` has looked at; a later call looks only at the ones after."""
        self._partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def wait_for_line(self, wanted: str, timeout: float = READY_TIMEOUT, *, prefix: bool = False) -> None:
        """Read output until a line equal to ``wanted`` (with ``prefix``: starting with it); fail if
        the program ends or stalls first.

        The pipe is read with ``os.read``, not through the buffered ``process.stdout``: a
        ``readline()`` there may take several lines into its buffer at once, and a ``select()``
        on the pipe then waits for output that was already read.
        """
        give_up = time.monotonic() + timeout
        while True:
            while self._scanned < len(self.lines):
                self._scanned += 1
                line = self.lines[self._scanned - 1]
                if line == wanted or (prefix and line.startswith(wanted)):
                    return
            if not self._read_more(give_up):
                raise AssertionError(f"the program never printed {wanted!r}; its output:\n{self.output()}")

    def _read_more(self, give_up: float) -> bool:
        """Read what the program printed next, by ``give_up``; whether it printed anything."""
        assert self.process.stdout is not None
        descriptor = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(descriptor, selectors.EVENT_READ)
            if not selector.select(timeout=max(0.0, give_up - time.monotonic())):
                return False
        chunk = os.read(descriptor, 1 << 16)
        if not chunk:
            return False
        *complete, self._partial = (self._partial + self._decoder.decode(chunk)).split("\n")
        self.lines.extend(complete)
        return True

    def finish(self, timeout: float = HANG_TIMEOUT) -> int:
        """Wait for the exit (failing the test if it hangs); the exit status, as ``Popen`` has it."""
        try:
            rest, _ = self.process.communicate(timeout=timeout)  # reading, so a full pipe never blocks it
        except subprocess.TimeoutExpired:
            self.process.kill()
            rest, _ = self.process.communicate()
            self._take_rest(rest)
            raise AssertionError(
                f"the program hung (killed after {timeout} s); its output:\n{self.output()}"
            ) from None
        self._take_rest(rest)
        return self.process.returncode

    def finish_or_kill(self, at: float) -> int:
        """Wait for the exit until ``time.monotonic()`` reaches ``at``, then SIGKILL it, as the
        kubelet does at the end of the grace period; the exit status (``-9`` when killed)."""
        try:
            rest, _ = self.process.communicate(timeout=max(0.0, at - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            rest, _ = self.process.communicate()
        self._take_rest(rest)
        return self.process.returncode

    def _take_rest(self, rest: str) -> None:
        self.lines.extend((self._partial + self._decoder.decode(b"", final=True) + rest).splitlines())
        self._partial = ""

    def output(self) -> str:
        """Everything read so far (all of it, once :meth:`finish` returned)."""
        return "\n".join(self.lines)

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)


@contextmanager
def running(
    argv: Sequence[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    module: str = "tests.faults.signals.programs",
    environment: Mapping[str, str] | None = None,
) -> Iterator[Program]:
    """Start ``python -m MODULE ARGV`` from the repository root (with ``environment`` added to
    this process's); kill and reap it on leaving."""
    env = {**os.environ, **(environment or {})}
    if storage_options is not None:
        env[STORAGE_OPTIONS_ENV] = json.dumps(dict(storage_options))
    process = subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # signals sent to the test's process group never reach it
    )
    try:
        yield Program(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
