"""The parent side of the crash tests: start workers, read their narration, kill them, reap them.

Starting a Python process that imports this package (and s3fs) costs 0.25-0.5 s of CPU, more
than the save it runs, so workers are forked from a :class:`Zygote`: one process started with
``subprocess`` (its own session) that has imported everything once. For each worker the zygote
opens a FIFO made by the parent, forks, and the child runs ``tests.faults.crash.workers.main`` with that
FIFO as its stdout, in its own session, asking the kernel to SIGKILL it if the zygote dies.

Reaping is explicit, so a PID is never reused under a pending kill: the zygote waits for a child
only when the parent asks (after its kill, or after its narration ended). A :class:`Worker` is a
context manager whose exit kills and reaps its child; a :class:`Zygote`'s exit kills and reaps
every child it still has, then itself. No process outlives the ``with`` block.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Generic, TypeVar

from tests.faults.crash.workers import STORAGE_OPTIONS_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]
SLOW_ENV = "FLYTE_CHECKPOINT_SLOW_TESTS"
MiB = 1 << 20
T = TypeVar("T")

READY_TIMEOUT = 60.0
"""Seconds a worker or the zygote may take to say it is ready (generous: CI machines stall)."""
FINISH_TIMEOUT = 120.0
"""Seconds an uninterrupted save or load may take."""


def slow_tests_enabled() -> bool:
    """Whether ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` asks for the large sizes."""
    return os.environ.get(SLOW_ENV, "") not in ("", "0")


def series_size(backend: str, kind: str) -> int:
    """Bytes per checkpoint in a crash series: 20 MiB, a directory about 24 MiB locally; with
    ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` 256 MiB locally and 64 MiB on S3."""
    slow = slow_tests_enabled()
    if backend == "s3":
        return (64 if slow else 20) * MiB
    return (256 if slow else 24 if kind == "dir" else 20) * MiB


PRELOAD = {"local": (), "s3": ("flyte_checkpoint.storage.stores.s3", "s3fs")}
"""Modules the zygote imports before forking workers, per backend."""
SPREAD = 1.2
"""Kills are spread from 0 to this multiple of a reference run's duration."""


@dataclass(frozen=True)
class Event:
    """One line of narration and when the parent read it (``time.monotonic``)."""

    at: float
    name: str
    words: tuple[str, ...]


class WorkerFailedError(AssertionError):
    """A worker exited, or fell silent, before saying what the test waited for."""


class LineReader:
    """Lines from a non-blocking file descriptor, each stamped with the time it was read."""

    def __init__(self, fd: int, *, owns_fd: bool = True) -> None:
        os.set_blocking(fd, False)
        self.fd = fd
        self._owns_fd = owns_fd
        self.events: list[Event] = []
        self.eof = False
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(fd, selectors.EVENT_READ)

    def pump(self, timeout: float) -> bool:
        """Read what arrives within ``timeout`` s; ``False`` once the writers are all gone."""
        if self.eof:
            return False
        if not self._selector.select(max(timeout, 0.0)):
            return True
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return True
        now = time.monotonic()
        if not chunk:
            self.eof = True
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            name, *words = line.decode().split(" ")
            self.events.append(Event(now, name, tuple(words)))
        return True

    def drain(self) -> None:
        """Read what is already written (a dead writer's last lines) without waiting for more."""
        while not self.eof and self._selector.select(0):
            self.pump(0)

    def close(self) -> None:
        self._selector.close()
        if self._owns_fd:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class Zygote:
    """``python -m tests.faults.crash.workers serve``: forks workers that need not import anything."""

    def __init__(self, log_dir: Path, *, preload: Sequence[str] = ()) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.log_path = log_dir / f"zygote-{uuid.uuid4().hex[:8]}.log"
        self._log = self.log_path.open("wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        self.process: subprocess.Popen[bytes] = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.crash.workers", "serve", *preload],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
            preexec_fn=_die_with_parent_preexec(),
        )
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self._requests: IO[bytes] = self.process.stdin
        self._replies = LineReader(self.process.stdout.fileno(), owns_fd=False)
        self.children: set[int] = set()
        try:
            self._reply("serving")
        except BaseException:
            self.close()
            raise

    def _reply(self, name: str) -> Event:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self._replies.events:
                event = self._replies.events.pop(0)
                if event.name != name:
                    raise WorkerFailedError(f"zygote said {event} instead of {name!r}: {self.log_tail()}")
                return event
            if not self._replies.pump(deadline - time.monotonic()) or time.monotonic() >= deadline:
                raise WorkerFailedError(f"zygote did not say {name!r}: {self.log_tail()}")

    def _request(self, request: Mapping[str, Any], reply: str) -> Event:
        self._requests.write(json.dumps(request).encode() + b"\n")
        self._requests.flush()
        return self._reply(reply)

    def spawn(
        self,
        argv: Sequence[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Worker:
        """Fork a worker running ``python -m tests.faults.crash.workers ARGV`` (without the imports)."""
        child_env = dict(env or {})
        if storage_options is not None:
            child_env[STORAGE_OPTIONS_ENV] = json.dumps(dict(storage_options))
        fifo = self.log_dir / f"narration-{uuid.uuid4().hex}"
        os.mkfifo(fifo, 0o600)
        try:
            # Opened before the zygote opens the write end, so its open does not block; the
            # zygote holds the write end until the fork, so no early end-of-file is seen.
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                reply = self._request(
                    {"fork": list(argv), "env": child_env, "narration": str(fifo)}, "forked"
                )
            except BaseException:
                os.close(fd)
                raise
        finally:
            fifo.unlink()
        pid = int(reply.words[0])
        self.children.add(pid)
        return Worker(self, pid, fd, " ".join(argv))

    def reap(self, pid: int) -> int:
        """Wait for child ``pid`` (through the zygote) and return its exit status (-9: SIGKILL)."""
        reply = self._request({"reap": pid}, "reaped")
        self.children.discard(pid)
        return int(reply.words[1])

    def log_tail(self) -> str:
        """The end of what the zygote and its children wrote to stderr."""
        self._log.flush()
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Kill and reap every child left, then stop the zygote and reap it."""
        try:
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self._requests.close()  # end of requests: the zygote reaps its children and exits
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        finally:
            self._replies.close()
            if self.process.stdout is not None:
                self.process.stdout.close()
            self._log.close()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _die_with_parent_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the zygote if pytest's main thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass(frozen=True)
class KillPoint:
    """When to kill a worker: ``delay`` seconds after it reports ``after_progress`` bytes done
    (after its ``started`` line when ``after_progress`` is negative)."""

    after_progress: int
    delay: float


def plan_kills(reference: Sequence[Event], end: str, count: int, spread: float) -> list[KillPoint]:
    """``count`` kill points spread uniformly over ``spread`` times a reference run's duration.

    Each point is the reference moment expressed from the last milestone (``started`` or a
    progress line) before it, so a run that writes faster or slower than the reference is still
    killed at the same place in its work; only the time within a stretch without progress
    (opening, the commit's fsync and rename, after the end) is a plain delay.
    """
    started = next(event.at for event in reference if event.name == "started")
    finished = next(event.at for event in reference if event.name == end)
    milestones = [(-1, started)] + [
        (int(event.words[0]), event.at) for event in reference if event.name == "progress"
    ]
    points = []
    for index in range(count):
        moment = started + spread * (finished - started) * index / (count - 1)
        done, at = [milestone for milestone in milestones if milestone[1] <= moment][-1]
        points.append(KillPoint(done, moment - at))
    return points


class Worker:
    """One forked child running :func:`tests.faults.crash.workers.main`, narrating into a FIFO."""

    def __init__(self, zygote: Zygote, pid: int, fd: int, command: str) -> None:
        self.zygote = zygote
        self.pid = pid
        self.command = command
        self.returncode: int | None = None
        self._narration = LineReader(fd)

    @property
    def events(self) -> list[Event]:
        return self._narration.events

    # -- narration ------------------------------------------------------------------------

    def seen(self, name: str) -> bool:
        """Whether the worker has said ``name`` (among the lines read so far)."""
        return any(event.name == name for event in self.events)

    def first(self, name: str) -> Event:
        """The first ``name`` line read so far."""
        for event in self.events:
            if event.name == name:
                return event
        raise KeyError(name)

    def progress_seen(self) -> int:
        """The largest byte count reported so far (``-1`` before any progress line)."""
        done = [int(event.words[0]) for event in self.events if event.name == "progress"]
        return max(done, default=-1)

    def wait_for(self, name: str, timeout: float = READY_TIMEOUT) -> Event:
        """Read until the worker says ``name``; fail with its story if it ends or stalls first."""
        deadline = time.monotonic() + timeout
        while not self.seen(name):
            if not self._narration.pump(deadline - time.monotonic()):
                raise WorkerFailedError(f"worker ended before saying {name!r}: {self.describe()}")
            if time.monotonic() >= deadline and not self.seen(name):
                raise WorkerFailedError(f"worker did not say {name!r} within {timeout} s: {self.describe()}")
        return self.first(name)

    def run_until(self, deadline: float) -> None:
        """Keep reading the narration until ``deadline`` (monotonic) or until the worker ends."""
        while time.monotonic() < deadline and self._narration.pump(deadline - time.monotonic()):
            pass

    def run_to(self, point: KillPoint) -> None:
        """Read the narration until ``point`` (or until the worker ends before reaching it)."""
        anchor = self.wait_for("started")
        if point.after_progress >= 0:
            deadline = time.monotonic() + FINISH_TIMEOUT
            while not (reached := self._progress_at_least(point.after_progress)):
                if not self._narration.pump(deadline - time.monotonic()):
                    return
                if time.monotonic() >= deadline:
                    raise WorkerFailedError(f"worker stalled before {point}: {self.describe()}")
            anchor = reached
        self.run_until(anchor.at + point.delay)

    def _progress_at_least(self, done: int) -> Event | None:
        for event in self.events:
            if event.name == "progress" and int(event.words[0]) >= done:
                return event
        return None

    def finish(self, timeout: float = FINISH_TIMEOUT) -> int:
        """Read to the end of the narration, reap the worker and return its exit status."""
        deadline = time.monotonic() + timeout
        while self._narration.pump(deadline - time.monotonic()):
            if time.monotonic() >= deadline:
                raise WorkerFailedError(f"worker did not finish within {timeout} s: {self.describe()}")
        return self._reap()

    # -- ending ---------------------------------------------------------------------------

    def _reap(self) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.reap(self.pid)
        return self.returncode

    def kill(self) -> int:
        """SIGKILL the worker (unless already reaped), reap it and return its exit status."""
        if self.returncode is None:
            # Not reaped yet, so the PID is still this child's (maybe a zombie): safe to signal.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        status = self._reap()
        # A worker that finished before the kill may have said "committed" after the last
        # read: its story must be whole before anyone asks what it said.
        self._narration.drain()
        return status

    def close(self) -> None:
        """Kill and reap the worker if that has not happened, and close its narration."""
        try:
            self.kill()
        finally:
            self._narration.close()

    def describe(self) -> str:
        """The command, the narration so far and the tail of stderr, for failure messages."""
        lines = [" ".join((event.name, *event.words)) for event in self.events]
        return (
            f"{self.command}: exit status {self.returncode}; said {lines!r}; "
            f"stderr of the zygote and its children:\n{self.zygote.log_tail()}"
        )

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def reaping(workers: list[Worker]) -> Iterator[list[Worker]]:
    """Close every worker appended to ``workers`` when the block ends, however it ends."""
    try:
        yield workers
    finally:
        for worker in workers:
            worker.close()


class OnceEach(Generic[T]):
    """Computes a value once per key and hands it to every test that asks.

    A failure is remembered too: later tests fail at once, pointing at the first failure,
    instead of running the whole series again.
    """

    def __init__(self) -> None:
        self._done: dict[Hashable, T | Exception] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key not in self._done:
            try:
                self._done[key] = compute()
            except Exception as exc:
                self._done[key] = exc
                raise
        value = self._done[key]
        if isinstance(value, Exception):
            raise RuntimeError(f"the series {key!r} failed in an earlier test: {value!r}") from value
        return value


# -- the outcome collector ------------------------------------------------------------------


@dataclass
class TrialLog:
    """What a series of kills found, for the terminal summary."""

    title: str
    outcomes: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    phase_label: str = "killed"

    @property
    def trials(self) -> int:
        return sum(self.outcomes.values())

    def line(self) -> str:
        outcomes = ", ".join(f"{name} {count}" for name, count in sorted(self.outcomes.items()))
        phases = ", ".join(f"{name} {count}" for name, count in sorted(self.phases.items()))
        notes = "".join(f"; {note}" for note in self.notes)
        return (
            f"{self.title}: {self.trials} trials in {self.seconds:.1f} s -> {outcomes}"
            f" ({self.phase_label} {phases}){notes}"
        )


RESULTS: list[TrialLog] = []
"""Every :class:`TrialLog` of this session, printed by ``tests/faults/crash/conftest.py`` at the end."""


def record(log: TrialLog) -> TrialLog:
    """Add ``log`` to the session summary and return it."""
    RESULTS.append(log)
    return log


# -- test data ------------------------------------------------------------------------------


def write_random_file(path: Path, size: int, seed: int) -> Path:
    """``size`` incompressible bytes, the same for the same ``seed``."""
    import random

    generator = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        left = size
        while left:
            step = min(left, 8 * MiB)
            out.write(generator.randbytes(step))
            left -= step
    return path


def write_model_tree(root: Path, size: int, seed: int) -> Path:
    """A directory shaped like a training checkpoint, about ``size`` bytes in total.

    Five sixths are incompressible weight shards, the rest text logs in many small files, with
    nested and empty directories and an in-tree symbolic link. Different seeds give different
    file sets (not only different bytes), so a mix of two trees could not pass for either.
    """
    import random

    generator = random.Random(seed)
    shards = 4
    shard_size = size * 5 // 6 // shards
    for index in range(shards):
        write_random_file(root / "weights" / f"shard-{index}-of-{shards}.bin", shard_size, seed * 100 + index)
    logs = 40
    log_size = max((size - shards * shard_size) // logs, 1)
    (root / "logs" / f"run-{seed}").mkdir(parents=True)
    for index in range(logs):
        words = " ".join(generator.choice(("loss", "step", "lr", "grad", "eval")) for _ in range(200))
        text = (f"step {index} seed {seed}: {words}\n" * (log_size // (len(words) + 40) + 1))[:log_size]
        (root / "logs" / f"run-{seed}" / f"log-{index:03}.txt").write_text(text)
    (root / "empty").mkdir()
    (root / "config.json").write_text(json.dumps({"seed": seed, "shards": shards}))
    os.symlink(f"weights/shard-0-of-{shards}.bin", root / "latest-shard")
    return root


# -- looking at what is stored ----------------------------------------------------------------


def observe(src: str, storage_options: Mapping[str, Any] | None, digests: Mapping[str, str]) -> str:
    """Load ``src`` on a fresh helper; name the version (a key of ``digests``) it gave back.

    Anything else is described instead: ``"none"``, ``"raised ..."`` or ``"unknown content ..."``.
    """
    from flyte_checkpoint import Checkpoint
    from tests.faults.crash.workers import content_digest

    try:
        with Checkpoint(
            "unused-destination", src, storage_options=storage_options, repair_prev_uri=False
        ) as checkpoint:
            restored = checkpoint.load_sync()
            if restored is None:
                return "none"
            digest = content_digest(restored)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    for name, expected in digests.items():
        if digest == expected:
            return name
    return f"unknown content (digest {digest[:12]})"


def local_temp_files(dest: str) -> frozenset[str]:
    """Names of the ``.fc-tmp`` files beside a local destination."""
    from flyte_checkpoint.storage.stores.local import temp_files_for

    return frozenset(path.name for path in temp_files_for(Path(dest)))
