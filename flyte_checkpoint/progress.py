"""Progress reporting for transfers: a callback told the bytes done and the total when known."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

ProgressCallback = Callable[[int, "int | None"], None]
"""``callback(bytes_done, total_bytes_or_None)``; may be called from a worker thread."""

logger = logging.getLogger("flyte_checkpoint")

_STEP = 1 << 20
_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(size: float) -> str:
    """``size`` bytes for people, in binary units: ``"512 bytes"``, ``"1.5 KiB"``, ``"3.8 MiB"``."""
    if size < 1024:
        return f"{int(size)} byte{'' if int(size) == 1 else 's'}"
    for unit in _UNITS:
        size /= 1024
        if size < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


class ProgressReporter:
    """Calls ``callback`` at most once per MiB transferred, and once more at the end."""

    def __init__(self, callback: ProgressCallback, total: int | None) -> None:
        self._callback = callback
        self.total = total
        self._reported = -1

    def advance(self, done: int) -> None:
        """Report ``done`` bytes if at least a MiB passed since the last report."""
        if done - self._reported >= _STEP:
            self._reported = done
            self._callback(done, self.total)

    def finish(self, done: int) -> None:
        """Report the final count, unless it was just reported."""
        if done != self._reported:
            self._reported = done
            self._callback(done, self.total)


class CombinedProgress:
    """The concurrent transfers of one operation (the parts of a multi-part checkpoint) told to
    one callback as their sum; safe to use from several threads."""

    def __init__(self, callback: ProgressCallback, total: int | None) -> None:
        self._lock = threading.Lock()
        self._done = 0
        self._reporter = ProgressReporter(callback, total)

    def add(self, count: int) -> None:
        with self._lock:
            self._done += count
            self._reporter.advance(self._done)

    def finish(self) -> None:
        with self._lock:
            self._reporter.finish(self._done)

    def writer_part(self) -> ProgressReporter:
        """A reporter for one part's writer (it reports that part's running count)."""
        return _PartReporter(self)

    def reader_part(self) -> ProgressCallback:
        """A callback for one part's reader (``(bytes_read, size)`` of that part)."""
        seen = [0]

        def tell(done: int, total: int | None) -> None:
            self.add(done - seen[0])
            seen[0] = done

        return tell


class _PartReporter(ProgressReporter):
    def __init__(self, combined: CombinedProgress) -> None:
        super().__init__(lambda done, total: None, None)
        self._combined = combined
        self._seen = 0

    def advance(self, done: int) -> None:
        self._combined.add(done - self._seen)
        self._seen = done

    def finish(self, done: int) -> None:
        self.advance(done)


def reporter(callback: ProgressCallback | None, total: int | None) -> ProgressReporter | None:
    """A :class:`ProgressReporter` for ``callback``, or ``None`` without one."""
    return None if callback is None else ProgressReporter(callback, total)


def combined(callback: ProgressCallback | None, total: int | None) -> CombinedProgress | None:
    """A :class:`CombinedProgress` for ``callback``, or ``None`` without one."""
    return None if callback is None else CombinedProgress(callback, total)


def log_transfer(verb: str, uri: str, what: str, size: int, started: float) -> None:
    """The one INFO line of a save or load: what, where, how much, how long, how fast."""
    seconds = max(time.monotonic() - started, 1e-9)
    logger.info(
        "%s %s %s: %s in %.3f s (%s/s)",
        verb,
        uri,
        what,
        human_size(size),
        seconds,
        human_size(size / seconds),
    )
