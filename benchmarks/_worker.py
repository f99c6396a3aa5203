"""One measured checkpoint operation, run in a fresh process by ``compare.py``.

Usage: ``python _worker.py '<json spec>'``. Prints one JSON object on stdout (the last line).

It runs under either implementation's interpreter (ours: the project's venv; the reference:
its own cached venv), so it imports nothing but the standard library at module level and
imports the implementation under test by name.

What it measures, for exactly one operation:

* ``wall_s``: wall time of the operation call(s) only. Interpreter start-up, imports and a
  1 KiB warm-up save and load (so lazy imports are paid before the clock starts), building the
  ``Checkpoint`` object, verification and cleanup are all outside it. For the 1 KiB payload the
  operation is repeated ``reps`` times and the median is reported.
* ``peak_rss_mib``: the process's whole peak resident memory (``VmHWM``, the kernel's
  high-water mark of this process image; see ``_peak_rss_mib`` for why not ``ru_maxrss``),
  interpreter and imports included. ``rss_before_mib`` is ``VmRSS`` just before the operation,
  so the difference is what the operation itself added.
* ``peak_temp_bytes``: the most bytes that existed at once in the dedicated ``TMPDIR`` beyond
  what was there before the operation, sampled by a thread every 10 ms. The
  restore workspace (``flyte-cp-*``, the *output* of a load) is not counted, and neither are
  hard links to the files being saved (a snapshot costs no disk); a temporary archive or a
  download staged before extraction is.
* ``stall_ms`` (async operations only): the longest gap between wake-ups of a ticker coroutine
  that sleeps 1 ms in a loop, i.e. the longest time the event loop could not run anything else.
  ``stall_cpu_ms`` is the CPU time the whole process used during that gap (see ``Ticker``).
* ``blocked_s`` (background saves only): the longest time a ``save(..., background=True)`` call
  held up its caller, over two calls: one when idle and one while the first is uploading.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import importlib
import json
import os
import pathlib
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

_SAMPLE_INTERVAL_S = 0.01
_TICK_S = 0.001
_WORKSPACE_PREFIX = "flyte-cp-"
_BACKGROUND_PAUSE_S = 0.1


# ---------------------------------------------------------------------------------------------
# Probes
# ---------------------------------------------------------------------------------------------


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _peak_rss_mib() -> float:
    """This process image's peak resident set.

    ``VmHWM`` where Linux provides it. ``getrusage(RUSAGE_SELF).ru_maxrss`` is the fallback only:
    Linux carries the pre-``exec`` high-water mark into it, and with ``vfork``-based spawning that
    is the *launching* process's whole RSS, so a small worker would report its parent's peak.
    """
    hwm = _status_mib("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _inodes_under(path: pathlib.Path) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    if path.is_file():
        status = path.stat()
        return {(status.st_dev, status.st_ino)}
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                status = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            found.add((status.st_dev, status.st_ino))
    return found


class TempSampler:
    """Samples the bytes held in ``root`` (see the module docstring for what is excluded)."""

    def __init__(self, root: pathlib.Path, ignore_inodes: set[tuple[int, int]]) -> None:
        self.root = root
        self.ignore = ignore_inodes
        self.baseline = self._measure()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="temp-sampler", daemon=True)

    def _measure(self) -> int:
        total = 0
        seen: set[tuple[int, int]] = set()
        try:
            top = list(os.scandir(self.root))
        except OSError:
            return 0
        for entry in top:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name.startswith(_WORKSPACE_PREFIX):
                        continue  # the restore workspace: the output of a load, not a temp file
                    for directory, _dirs, files in os.walk(entry.path):
                        for name in files:
                            total += self._size(os.path.join(directory, name), seen)
                else:
                    total += self._size(entry.path, seen)
            except OSError:
                continue  # removed while we looked
        return total

    def _size(self, path: str, seen: set[tuple[int, int]]) -> int:
        try:
            status = os.lstat(path)
        except OSError:
            return 0
        key = (status.st_dev, status.st_ino)
        if key in seen or key in self.ignore:
            return 0
        seen.add(key)
        return status.st_size

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._measure())
            self._stop.wait(_SAMPLE_INTERVAL_S)

    def __enter__(self) -> TempSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._measure())

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.baseline)


class Ticker:
    """Measures the longest event-loop stall while it runs.

    With the longest gap it records how much CPU time the whole process used during it: about
    the gap (or more, with several threads busy) when this process kept the loop from running
    (a long GIL hold, GIL contention); far less when the process was simply not scheduled
    because other processes had the CPUs.
    """

    def __init__(self) -> None:
        self.max_gap = 0.0
        self.max_gap_cpu = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last, last_cpu = time.perf_counter(), time.process_time()
        while True:
            await asyncio.sleep(_TICK_S)
            now, now_cpu = time.perf_counter(), time.process_time()
            if now - last > self.max_gap:
                self.max_gap, self.max_gap_cpu = now - last, now_cpu - last_cpu
            self.ticks += 1
            last, last_cpu = now, now_cpu

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)  # let it take its first timestamp
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        await asyncio.sleep(0)  # one more chance to observe a stall that just ended
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def tree_digest(root: pathlib.Path) -> str:
    """A digest of a directory tree's relative names, kinds and file contents, or of one file."""
    digest = hashlib.sha256()
    if root.is_file():
        with open(root, "rb") as content:
            while chunk := content.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {name} {os.readlink(path)}\n".encode())
        elif path.is_dir():
            digest.update(f"D {name}\n".encode())
        else:
            digest.update(f"F {name} {path.stat().st_size}\n".encode())
            with open(path, "rb") as content:
                while chunk := content.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# The two implementations behind one small interface
# ---------------------------------------------------------------------------------------------


class Impl:
    """Builds checkpoint objects of one implementation and runs their operations."""

    name = ""

    def make(self, dest: str, src: str | None) -> Any:
        raise NotImplementedError

    def close(self, checkpoint: Any) -> None:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError


class Ours(Impl):
    name = "ours"

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        self.module = importlib.import_module("flyte_checkpoint")
        self.storage_options = storage_options

    def make(self, dest: str, src: str | None) -> Any:
        return self.module.Checkpoint(dest, src, storage_options=self.storage_options)

    def close(self, checkpoint: Any) -> None:
        checkpoint.close()

    def version(self) -> str:
        return str(self.module.__version__)


class Reference(Impl):
    name = "reference"

    def __init__(self) -> None:
        self.module = importlib.import_module("flyte")  # only in the reference's own venv

    def make(self, dest: str, src: str | None) -> Any:
        return self.module.Checkpoint(dest, src)

    def close(self, checkpoint: Any) -> None:
        checkpoint._td.cleanup()  # what its __del__ does

    def version(self) -> str:
        from importlib.metadata import version

        return version("flyte")


def _load_impl(spec: dict[str, Any]) -> Impl:
    if spec["impl"] == "ours":
        return Ours(spec.get("storage_options"))
    return Reference()


# ---------------------------------------------------------------------------------------------
# Running one operation
# ---------------------------------------------------------------------------------------------


def _payload(spec: dict[str, Any]) -> pathlib.Path | bytes:
    data = pathlib.Path(spec["data"])
    if spec["kind"] == "bytes":
        return data.read_bytes()
    return data


def _warm_up(impl: Impl, uri: str) -> None:
    """A 1 KiB save and load, so imports and client sessions are set up before timing."""
    checkpoint = impl.make(uri, None)
    checkpoint.save_sync(b"w" * 1024)
    impl.close(checkpoint)
    restored = impl.make(uri + ".unused", uri)
    restored.load_sync()
    impl.close(restored)


def _call(checkpoint: Any, spec: dict[str, Any], data: pathlib.Path | bytes | None) -> Callable[[], Any]:
    """The blocking call that performs the operation (sync mode)."""
    if spec["op"] == "save":
        return lambda: checkpoint.save_sync(data)
    return lambda: checkpoint.load_sync()


def _acall(
    checkpoint: Any, spec: dict[str, Any], data: pathlib.Path | bytes | None
) -> Callable[[], Awaitable[Any]]:
    if spec["op"] == "save":
        return lambda: checkpoint.save(data)
    return lambda: checkpoint.load()


def stall_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """The ticker's longest gap while a thread sleeps, or spins in Python, for ``seconds``.

    No checkpoint code runs: this is the floor that the machine (other processes, the GIL's
    5 ms switch interval) puts under every ``stall_ms`` figure.
    """
    seconds = float(spec.get("seconds", 1.0))

    def spin() -> None:
        deadline = time.perf_counter() + seconds
        count = 0
        while time.perf_counter() < deadline:
            count += 1

    work = spin if spec["kind"] == "python" else (lambda: time.sleep(seconds))

    async def main() -> Ticker:
        async with Ticker() as ticker:
            await asyncio.to_thread(work)
        return ticker

    ticker = asyncio.run(main())
    return {"stall_ms": ticker.max_gap * 1000, "stall_cpu_ms": ticker.max_gap_cpu * 1000, "wall_s": seconds}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["op"] == "stall-baseline":
        return stall_baseline(spec)
    impl = _load_impl(spec)
    _warm_up(impl, spec["warmup_uri"])
    data = _payload(spec) if spec["op"] in ("save", "save-background") else None
    ignore: set[tuple[int, int]] = set()
    if isinstance(data, pathlib.Path):
        ignore = _inodes_under(data)
    reps = int(spec.get("reps", 1))
    tmpdir = pathlib.Path(tempfile.gettempdir())
    gc.collect()
    result: dict[str, Any] = {"impl": impl.name, "version": impl.version(), "python": sys.version.split()[0]}
    result["rss_before_mib"] = _status_mib("VmRSS")

    with TempSampler(tmpdir, ignore) as sampler:
        if spec["op"] == "save-background":
            figures = _background(impl, spec, data)
        elif spec["mode"] == "sync":
            figures = _timed_sync(impl, spec, data, reps)
        else:
            figures = asyncio.run(_timed_async(impl, spec, data, reps))
    result.update(figures)
    result["peak_rss_mib"] = _peak_rss_mib()
    result["peak_temp_bytes"] = sampler.extra
    return result


def _timed_sync(
    impl: Impl, spec: dict[str, Any], data: pathlib.Path | bytes | None, reps: int
) -> dict[str, Any]:
    times: list[float] = []
    digest: str | None = None
    save_target: Any = impl.make(spec["dest"], None) if spec["op"] == "save" else None
    for rep in range(reps):
        checkpoint = save_target if save_target is not None else impl.make(spec["dest"], spec["src"])
        call = _call(checkpoint, spec, data)
        started = time.perf_counter()
        restored = call()
        times.append(time.perf_counter() - started)
        if spec["op"] == "load":
            digest = _check_restored(restored, spec, rep, digest)
            impl.close(checkpoint)
    if save_target is not None:
        impl.close(save_target)
    return {"wall_s": statistics.median(times), "rep_min_s": min(times), "reps": reps, "digest": digest}


async def _timed_async(
    impl: Impl, spec: dict[str, Any], data: pathlib.Path | bytes | None, reps: int
) -> dict[str, Any]:
    times: list[float] = []
    digest: str | None = None
    stall = stall_cpu = 0.0
    ticks = 0
    save_target: Any = impl.make(spec["dest"], None) if spec["op"] == "save" else None
    for rep in range(reps):
        checkpoint = save_target if save_target is not None else impl.make(spec["dest"], spec["src"])
        call = _acall(checkpoint, spec, data)
        async with Ticker() as ticker:
            started = time.perf_counter()
            restored = await call()
            times.append(time.perf_counter() - started)
        if ticker.max_gap > stall:
            stall, stall_cpu = ticker.max_gap, ticker.max_gap_cpu
        ticks += ticker.ticks
        if spec["op"] == "load":
            digest = _check_restored(restored, spec, rep, digest)
            impl.close(checkpoint)
    if save_target is not None:
        impl.close(save_target)
    return {
        "wall_s": statistics.median(times),
        "rep_min_s": min(times),
        "reps": reps,
        "digest": digest,
        "stall_ms": stall * 1000,
        "stall_cpu_ms": stall_cpu * 1000,
        "ticks": ticks,
    }


def _check_restored(restored: Any, spec: dict[str, Any], rep: int, digest: str | None) -> str | None:
    if restored is None:
        raise RuntimeError(f"load of {spec['src']} restored nothing")
    if spec.get("verify") and rep == 0:
        return tree_digest(pathlib.Path(restored))
    return digest


def _background(impl: Impl, spec: dict[str, Any], data: pathlib.Path | bytes | None) -> dict[str, Any]:
    """Two background saves (one idle, one while the first uploads), then wait for both."""
    checkpoint = impl.make(spec["dest"], None)
    blocked: list[float] = []
    stall: float | None = None
    stall_cpu = 0.0
    started = time.perf_counter()
    if spec["mode"] == "sync":
        for _ in range(2):
            call_started = time.perf_counter()
            checkpoint.save_sync(data, background=True)
            blocked.append(time.perf_counter() - call_started)
            time.sleep(_BACKGROUND_PAUSE_S)  # the caller's own work
        waited = time.perf_counter()
        checkpoint.wait_sync()
    else:

        async def main() -> tuple[float, Ticker]:
            async with Ticker() as ticker:
                for _ in range(2):
                    call_started = time.perf_counter()
                    await checkpoint.save(data, background=True)
                    blocked.append(time.perf_counter() - call_started)
                    await asyncio.sleep(_BACKGROUND_PAUSE_S)
                waited = time.perf_counter()
                await checkpoint.wait()
            return waited, ticker

        waited, ticker = asyncio.run(main())
        stall = ticker.max_gap * 1000
        stall_cpu = ticker.max_gap_cpu * 1000
    finished = time.perf_counter()
    impl.close(checkpoint)
    figures: dict[str, Any] = {
        "wall_s": finished - started,
        "blocked_s": max(blocked),
        "blocked_each_s": blocked,
        "wait_s": finished - waited,
        "reps": 1,
        "digest": None,
    }
    if stall is not None:
        figures["stall_ms"] = stall
        figures["stall_cpu_ms"] = stall_cpu
    return figures


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[1])
    try:
        result = run(spec)
    except BaseException as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}))
        return 1
    finally:
        # Leave nothing behind in the dedicated TMPDIR (the parent also removes it).
        for child in pathlib.Path(tempfile.gettempdir()).iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
