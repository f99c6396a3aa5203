"""Freeing a replaced local object off the saving thread.

Renaming a new file over an object frees the object's blocks inside the ``rename`` call: on
ext4 that was 0.1 ms of a 0.3 ms 1 KiB save, and grows with the object's size. So the object
about to be replaced first gets a second name, ``.<name>.<random>.fc-old`` beside it; the rename
then only drops a link, and a daemon thread unlinks the second name, which frees the blocks.
Names left by a process that died in between are removed by the next save of that object.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from pathlib import Path

RETIRED_SUFFIX = ".fc-old"


def retire(dest: Path) -> Path | None:
    """Give the object at ``dest`` a second name; ``None`` if there is none or links fail."""
    retired = f"{dest.parent}/.{dest.name}.{os.urandom(8).hex()}{RETIRED_SUFFIX}"
    try:
        os.link(dest, retired, follow_symlinks=False)
    except OSError:  # no object yet, or no hard links here: the rename frees it inline
        return None
    return Path(retired)


def release(retired: Path) -> None:
    """Unlink ``retired`` in the background (at exit at the latest)."""
    _REAPER.put(retired)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class _Reaper:
    """One daemon thread per process that unlinks what it is given, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.drain)

    def _reset(self) -> None:
        # A forked child has the parent's queue object but not its thread: start afresh.
        self._queue: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, path: Path) -> None:
        self._queue.put(path)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flyte-checkpoint-reaper", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            _unlink(self._queue.get())

    def drain(self) -> None:
        """Unlink everything still queued, in the calling thread."""
        while True:
            try:
                path = self._queue.get_nowait()
            except queue.Empty:
                return
            _unlink(path)


_REAPER = _Reaper()
