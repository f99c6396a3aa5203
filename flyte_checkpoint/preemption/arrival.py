"""When a signal arrived, recorded as it arrives, not when Python runs its handler.

Python runs a signal handler in the main thread between two bytecodes: after a long C call
there (a hash of a large file, a regular expression, a C extension holding the GIL) the handler
runs seconds late, and a grace clock started there is seconds slow (an outside harness saw
``time_left()`` say 30.0 s with 28.1 s left, and a save ended in SIGKILL). The C-level handler
writes each signal's number to the wakeup fd at once (:func:`signal.set_wakeup_fd`); this
module makes that fd a datagram socket whose kernel receive timestamps (``SO_TIMESTAMPNS``) say
when each signal came, and a watcher thread records the notice from them. Bytes are passed on
to the wakeup fd that was set before (an asyncio loop's), so that keeps working.

The watcher needs the GIL to record: after a C call that held it, the handler's own (late)
notice may be the current one for the few milliseconds until the watcher runs and replaces it
with the earlier-dated one (a notice with a sooner deadline always wins).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("flyte_checkpoint")

_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@qq")
_POLL_SECONDS = 0.25
_WAKE = b"\0"
"""Sent by :meth:`ArrivalWatcher.stop` (no signal has number 0)."""

Arrived = Callable[[int, float], None]
"""Told ``(signum, time.monotonic() at arrival)`` for each signal that arrived, in the watcher."""


class ArrivalWatcher:
    """Owns the process's wakeup fd while preemption handling is installed (main thread only)."""

    def __init__(self, arrived: Arrived) -> None:
        self._arrived = arrived
        self._skipped: dict[int, int] = {}
        self._lock = threading.Lock()
        self._reader, self._writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._writer.setblocking(False)
        if _SO_TIMESTAMPNS is not None:
            with contextlib.suppress(OSError):  # then the watcher's own clock dates each signal
                self._reader.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._previous = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="flyte-checkpoint-signals", daemon=True)
        self._thread.start()

    def skip_next(self, signum: int) -> None:
        """The next arrival of ``signum`` is one this package sends itself: do not report it."""
        with self._lock:
            self._skipped[signum] = self._skipped.get(signum, 0) + 1

    def stop(self) -> None:
        """Give the wakeup fd back to whoever had it (if it is still ours) and end the watcher."""
        with contextlib.suppress(ValueError):  # not the main thread: leave the fd as it is
            replaced = signal.set_wakeup_fd(self._previous)
            if replaced != self._writer.fileno():  # someone set theirs after ours: keep it
                signal.set_wakeup_fd(replaced)
        self._stop.set()
        with contextlib.suppress(OSError):
            self._writer.send(_WAKE)  # the watcher is waiting in select: wake it now
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._close()

    def forget_in_child(self) -> None:
        """In a fork child: the socket is shared with the parent, so the child must never write
        its own signals to it (they would read as the parent's). Called right after the fork."""
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self._previous)
        self._close()

    def _close(self) -> None:
        for end in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                end.close()

    def _watch(self) -> None:
        space = socket.CMSG_SPACE(_TIMESPEC.size)
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._reader], [], [], _POLL_SECONDS)
                if not ready:
                    continue
                data, ancillary, _, _ = self._reader.recvmsg(64, space)
            except (OSError, ValueError):
                return  # closed under us: stopped
            now_monotonic, now_real = time.monotonic(), time.time()
            arrived = now_monotonic
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                    seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                    late = now_real - (seconds + nanoseconds / 1e9)
                    arrived = now_monotonic - min(max(late, 0.0), 3600.0)
            for signum in data:
                if signum == _WAKE[0]:
                    continue
                self._pass_on(signum)
                with self._lock:
                    if self._skipped.get(signum):
                        self._skipped[signum] -= 1
                        continue
                try:
                    self._arrived(signum, arrived)
                except Exception as error:  # never let the watcher die: the handler still records
                    logger.debug("recording the arrival of signal %d failed: %r", signum, error)

    def _pass_on(self, signum: int) -> None:
        if self._previous >= 0:
            with contextlib.suppress(OSError):
                os.write(self._previous, bytes([signum]))
