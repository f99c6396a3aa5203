"""python-isal's threaded gzip writer is finished and abandoned without unbounded waits."""

from __future__ import annotations

import gzip
import io
import os
import threading

import pytest

from flyte_checkpoint.archive import HAVE_ISAL
from flyte_checkpoint.archive.compression import gzip_writer

pytestmark = pytest.mark.skipif(not HAVE_ISAL, reason="the threaded writer is python-isal's")


def isal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "igzip" in repr(getattr(t, "_target", None))]


def interrupt_a_stream(sink: io.BytesIO, size: int, *, break_its_queue_count: bool = False) -> None:
    """Write ``size`` random bytes into a gzip stream over ``sink``, then raise KeyboardInterrupt."""
    with gzip_writer(sink, 1) as stream:
        stream.write(os.urandom(size))
        if break_its_queue_count:  # what an interrupt inside Queue.put leaves behind
            getattr(stream, "raw").input_queues[0].unfinished_tasks += 1  # noqa: B009
        raise KeyboardInterrupt


def test_a_finished_stream_is_a_complete_gzip_of_what_was_written() -> None:
    data = os.urandom(3 << 20) + b"text " * 200_000
    sink = io.BytesIO()
    with gzip_writer(sink, 1) as stream:
        stream.write(data)
    assert gzip.decompress(sink.getvalue()) == data


def test_an_exception_inside_the_block_abandons_the_stream_and_stops_its_workers() -> None:
    sink = io.BytesIO()
    with pytest.raises(KeyboardInterrupt):
        interrupt_a_stream(sink, 4 << 20)
    written = len(sink.getvalue())
    assert not isal_threads()
    with pytest.raises(EOFError):  # no trailer: never mistaken for a whole archive
        gzip.decompress(sink.getvalue())
    assert len(sink.getvalue()) == written  # nothing reaches the sink afterwards


def test_a_stream_whose_queue_counts_an_interrupt_left_inconsistent_is_still_abandoned() -> None:
    sink = io.BytesIO()
    with pytest.raises(KeyboardInterrupt):
        interrupt_a_stream(sink, 1 << 20, break_its_queue_count=True)
    assert not isal_threads()
