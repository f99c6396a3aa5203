"""Freeing a replaced local object off the saving thread.

Renaming a new file over an object frees the object's blocks inside the ``rename`` call: on
ext4 that was 0.1 ms of a 0.3 ms 1 KiB save, and grows with the object's size. So the object
about to be replaced first gets a second name, ``.<name>.<random>.fc-old`` beside it; the rename
then only drops a link, and a daemon thread unlinks the second name, which frees the blocks.
A process that ends by returning, ``sys.exit`` or Ctrl-C unlinks its names at exit; names left
by a process killed outright are removed by the next save of that object.
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
    """Give the object at ``dest`` a second name; ``None`` if there is none or links fail.

    The name is held for unlinking at exit before it exists, so that an interrupt landing
    anywhere from here to :func:`release` still leaves no second name once the process ends.
    """
    retired = Path(f"{dest.parent}/.{dest.name}.{os.urandom(8).hex()}{RETIRED_SUFFIX}")
    _REAPER.hold(retired)
    try:
        os.link(dest, retired, follow_symlinks=False)
    except OSError:  # no object yet, or no hard links here: the rename frees it inline
        _REAPER.forget(retired)
        return None
    return retired


def release(retired: Path) -> None:
    """Unlink ``retired`` (a name from :func:`retire`, so held already) in the background, at
    exit at the latest."""
    _REAPER.put(retired)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class _Reaper:
    """One daemon thread per process that unlinks what it is given, in order.

    Every name stays in ``_held`` until it is unlinked, including while the thread is between
    taking it off the queue and unlinking it: at exit the interpreter stops daemon threads
    wherever they are, so :meth:`drain` unlinks what is held, not only what is still queued.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()
        os.register_at_fork(after_in_child=self._reset)
        atexit.register(self.drain)

    def _reset(self) -> None:
        # A forked child has the parent's queue object but not its thread, and the parent's
        # thread unlinks the parent's names: start afresh.
        self._queue: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._held: set[Path] = set()

    def hold(self, path: Path) -> None:
        with self._lock:
            self._held.add(path)

    def forget(self, path: Path) -> None:
        with self._lock:
            self._held.discard(path)

    def put(self, path: Path) -> None:
        self._queue.put(path)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flyte-checkpoint-reaper", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            _unlink(path)
            self.forget(path)

    def drain(self) -> None:
        """Unlink every name still held, in the calling thread."""
        with self._lock:
            held, self._held = self._held, set()
        for path in held:
            _unlink(path)


_REAPER = _Reaper()
