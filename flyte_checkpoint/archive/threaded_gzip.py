"""Finishing and abandoning python-isal's threaded gzip writer without ever waiting forever.

``igzip_threaded``'s writer compresses on worker threads fed by bounded queues, and its
``close()`` waits with ``Queue.join()`` and ``Thread.join()``, neither of which has a time limit.
An interrupt (Ctrl-C, or a SIGTERM handler that calls ``sys.exit``) lands between two bytecodes
of the main thread, which may be inside ``Queue.put``: the queue's count of unfinished blocks
then no longer matches its contents, ``join()`` never returns, and the process hung until it was
SIGKILLed (5 of 8 interrupted directory saves here). Its ``stop()`` can also leave a worker
blocked forever on a full output queue whose consumer already left.

So the normal finish waits for the workers in short, interruptible slices, and every error path
(an interrupt included) *abandons* the stream: it tells the workers to drop what they hold,
empties their queues until they have exited (bounded by :data:`ABANDON_SECONDS`) and marks the
writer closed, so nothing more reaches the sink and no trailer is written. The caller's atomic
writer then discards the partial object.

This leans on attributes of python-isal's writer (``input_queues``, ``output_queues``,
``compression_workers``, ``output_worker``, ``lock``, ``exception``, ``running``, ``_closed``),
stable from 1.6 to 1.9; :func:`supports` checks the writer class sets them, and where it does
not, python-isal's single-threaded writer is used instead.
"""

from __future__ import annotations

import contextlib
import io
import queue
import time
from typing import IO, Any

ABANDON_SECONDS = 2.0
"""The longest abandoning a stream waits for python-isal's workers to leave."""
_POLL = 0.05

_ATTRIBUTES = (
    "input_queues",
    "output_queues",
    "compression_workers",
    "output_worker",
    "lock",
    "exception",
    "running",
    "_closed",
)


class StreamAbandoned(Exception):
    """Set as the writer's error so its workers drop every block they still hold."""


def supports(module: Any) -> bool:
    """Whether the writer of ``module`` (``isal.igzip_threaded``) sets what is used here."""
    writer = getattr(module, "_ThreadedGzipWriter", None)
    init = getattr(writer, "__init__", None)
    names = set(getattr(getattr(init, "__code__", None), "co_names", ()))
    return all(name in names for name in _ATTRIBUTES)


def finish(buffered: IO[bytes]) -> None:
    """Write the rest of the stream and its trailer; on any failure, :func:`abandon` it."""
    raw: Any = getattr(buffered, "raw")  # noqa: B009 - typed IO[bytes] has no .raw
    assert isinstance(buffered, io.BufferedWriter)
    try:
        io.BufferedWriter.flush(buffered)  # the buffer only: isal's own flush() joins unbounded
        for pending in (*raw.input_queues, *raw.output_queues):
            _wait_until_done(pending, raw)
        buffered.close()  # nothing left in flight: its joins return at once
    except BaseException:
        abandon(buffered)
        raise


def abandon(buffered: IO[bytes]) -> None:
    """Stop the workers without finishing the stream: nothing more is written to the sink."""
    raw: Any = getattr(buffered, "raw")  # noqa: B009
    with raw.lock:
        if raw.exception is None:
            raw.exception = StreamAbandoned("the gzip stream was abandoned")
    raw.running = False
    threads = [*raw.compression_workers, raw.output_worker]
    queues = [*raw.input_queues, *raw.output_queues]
    give_up = time.monotonic() + ABANDON_SECONDS
    while any(thread.is_alive() for thread in threads) and time.monotonic() < give_up:
        for pending in queues:  # a worker blocked on a full queue gets room and sees `running`
            with contextlib.suppress(queue.Empty):
                while True:
                    pending.get_nowait()
        for thread in threads:
            thread.join(0.01)
    raw._closed = True
    # The buffered layer's close now fails at its flush (the writer raises its error) and then
    # closes the writer, which is a no-op: the buffer is dropped, not written.
    with contextlib.suppress(Exception):
        buffered.close()


def _wait_until_done(pending: queue.Queue[Any], raw: Any) -> None:
    """``pending.join()`` in slices: an interrupt or a worker's error ends the wait."""
    with pending.all_tasks_done:
        while pending.unfinished_tasks and raw.exception is None:
            pending.all_tasks_done.wait(_POLL)
    if raw.exception is not None:
        raise raw.exception
