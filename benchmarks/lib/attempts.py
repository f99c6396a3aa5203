"""Training attempts as processes: forked from one server that did the heavy imports once, each
writing its events to a file the harness polls, killed with its whole process group."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import _preemption_trainer as trainer  # stdlib-only at module level
from benchmarks.lib.processes import POLL_S, group_members


class HarnessError(RuntimeError):
    """The harness itself failed (an attempt could not start, a server did not answer)."""


class Processes:
    """Starts attempts, forked from one server that has the heavy imports done."""

    def __init__(self, work: Path) -> None:
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(["__main__", *trainer.PRELOAD])
        self.work = work
        self.live: set[Any] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def start(
        self, target: Callable[[dict[str, Any]], None], spec: dict[str, Any], daemon: bool = True
    ) -> Any:
        """``daemon=False`` for a job that starts processes of its own (multiprocessing forbids a
        daemon that); :meth:`kill_all` ends it all the same."""
        process = self.context.Process(target=target, args=(spec,), daemon=daemon)
        with self.lock:
            if self.stopped:
                raise HarnessError("the benchmark was interrupted")
            process.start()
            self.live.add(process)
        return process

    def stop(self) -> None:
        """Kill every attempt and refuse new ones: the supervisors' threads then end at once."""
        with self.lock:
            self.stopped = True
        self.kill_all()

    def reap(self, process: Any) -> None:
        # A job with processes of its own (not a daemon) leads its process group: it is killed
        # whole, its fork children too; only its group, never a group a reused pid might lead.
        group = not process.daemon and process.pid is not None
        if process.is_alive():
            if group:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            process.kill()
        process.join()
        if group and group_members(process.pid):  # children that outlived it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        with self.lock:
            self.live.discard(process)

    def kill_all(self) -> None:
        with self.lock:
            live = list(self.live)
        for process in live:
            self.reap(process)

    def spec(self, directory: Path, **fields: Any) -> dict[str, Any]:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "tmp").mkdir(exist_ok=True)
        return {
            "events": str(directory / "events.jsonl"),
            "stdout": str(directory / "stdout.log"),
            "stderr": str(directory / "stderr.log"),
            "tmp": str(directory / "tmp"),
            "state_dir": str(directory / "state"),
            "seed": 7,
            **fields,
        }

    def run_to_end(
        self, target: Callable[[dict[str, Any]], None], spec: dict[str, Any], timeout: float
    ) -> list[dict[str, Any]]:
        """Start ``target(spec)``, wait for it, return its events; fail loudly if it failed."""
        process = self.start(target, spec)
        try:
            process.join(timeout)
        finally:
            self.reap(process)
        events = trainer.read_events(Path(spec["events"]))
        if process.exitcode != 0:
            raise HarnessError(f"{target.__name__} exited {process.exitcode}: {tail(spec['stderr'])}")
        return events


def tail(path: str, chars: int = 2000) -> str:
    """The last ``chars`` characters of the log at ``path`` ("" if it cannot be read)."""
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")[-chars:]
    return ""


def wait_for_event(
    process: Any,
    path: Path,
    name: str,
    timeout: float,
    after: int = 0,
    test: Callable[[dict[str, Any]], bool] = lambda event: True,
) -> list[dict[str, Any]] | None:
    """Poll the event log until an event called ``name`` (passing ``test``, past the first
    ``after`` events) appears; ``None`` if the process ended first or at the timeout."""

    def found(events: list[dict[str, Any]]) -> bool:
        return any(event["e"] == name and test(event) for event in events[after:])

    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        events = trainer.read_events(path)
        if found(events):
            return events
        if not process.is_alive():
            events = trainer.read_events(path)
            return events if found(events) else None
        time.sleep(POLL_S)
    return None
