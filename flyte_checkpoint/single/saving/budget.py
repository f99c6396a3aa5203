"""Whether one more save fits in the time a preemption notice leaves, from this helper's own saves."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flyte_checkpoint.errors import PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.progress import human_size

_Kind = str  # "bytes", "file" or "directory"
_REMEMBERED = 3
"""Saves of each kind the estimate looks back on."""


def _kind_and_size(content: bytes | Path) -> tuple[_Kind, int | None]:
    """What is saved and, where a stat tells it cheaply, how many bytes (``None`` for a directory:
    its size would take a walk of the tree, and a training state's is much the same each time)."""
    if isinstance(content, bytes):
        return "bytes", len(content)
    try:
        status = os.stat(content)
    except OSError:
        return "file", None
    if os.path.isdir(content):
        return "directory", None
    return "file", status.st_size


class SaveDurations:
    """The durations of this helper's last few committed saves of each kind, and when saves committed.

    After a notice, :meth:`check_fits` refuses to start a save whose estimate (the quickest of
    the last few saves of the same kind, scaled by size where the size is known) does not fit
    before the save deadline while an older save of the helper is in flight: the time left is
    that one's to commit in. With nothing in flight the save is tried all the same, bounded by
    the deadline: refusing it could only lose the newer state, and the estimate leans long (a
    process's first saves, made in the background beside training, took 2-3 times as long as
    the final save after a notice in the preemption benchmark). A helper that never saved has
    nothing to go by, so its save is tried too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recent: dict[_Kind, collections.deque[tuple[int | None, float]]] = {}
        self._last_commit: float | None = None

    @contextmanager
    def measure(self, content: bytes | Path) -> Iterator[None]:
        """Time the save in the block; record it when it commits."""
        kind, size = _kind_and_size(content)
        started = time.monotonic()
        yield
        finished = time.monotonic()
        with self._lock:
            self._recent.setdefault(kind, collections.deque(maxlen=_REMEMBERED)).append(
                (size, finished - started)
            )
            self._last_commit = finished

    def committed_since(self, moment: float) -> bool:
        """Whether a save committed after ``moment`` (``time.monotonic()``)."""
        with self._lock:
            return self._last_commit is not None and self._last_commit >= moment

    def estimate(self, content: bytes | Path) -> tuple[float, str] | None:
        """Seconds a save of ``content`` should take and what that is based on; ``None`` if unknown."""
        kind, size = _kind_and_size(content)
        with self._lock:
            recent = list(self._recent.get(kind, ()))
        if not recent:
            return None
        # The quickest of the last few: a process's first save is slower (connections, caches),
        # and judging by it refused final saves that fitted.
        estimates = [
            (seconds if size is None or not earlier else seconds * size / earlier, earlier, seconds)
            for earlier, seconds in recent
        ]
        estimate, earlier, seconds = min(estimates)
        if size is None or not earlier:
            return estimate, f"the quickest of the last {kind} saves took {seconds:.1f} s"
        moved = human_size(earlier)
        return estimate, f"the quickest of the last {kind} saves moved {moved} in {seconds:.1f} s"

    def check_fits(self, content: bytes | Path, uri: str, *, older_in_flight: bool) -> None:
        """Raise :class:`PreemptionDeadlineError` if no time is left for a save of ``content``, or
        if ``older_in_flight`` (a save of this helper is uploading) and it is estimated not to fit."""
        current = notice.current_notice()
        deadline = notice.save_deadline()
        if current is None or deadline is None:
            return
        left = deadline.at - time.monotonic()
        if left > 0:
            estimate = self.estimate(content)
            if not older_in_flight or estimate is None or estimate[0] <= left:
                return
            why = f"it is estimated at {estimate[0]:.1f} s ({estimate[1]})"
            kept = "the save already in flight is given the time instead"
        else:
            why = "no time is left"
            kept = "the checkpoint there (or the save already in flight) is kept"
        raise PreemptionDeadlineError(
            f"not saving to {uri}: {why}, and {max(left, 0.0):.1f} s remain before the save deadline "
            f"({current.describe()}, {current.margin:.1f} s kept free to exit); {kept}"
        )
