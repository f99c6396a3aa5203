"""The threaded archive writer is finished and abandoned without unbounded waits."""

from __future__ import annotations

import gzip
import io
import os
import threading

import pytest

from flyte_checkpoint.archive.compression import gzip_writer
from flyte_checkpoint.archive.member_writer import THREAD_PREFIX
from flyte_checkpoint.archive.members import TAIL_CONTENT


def encoding_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def interrupt_a_stream(sink: io.BytesIO, size: int, *, threads: int = 2) -> None:
    """Write ``size`` random bytes into a gzip stream over ``sink``, then raise KeyboardInterrupt."""
    with gzip_writer(sink, 1, threads) as stream:
        stream.write(os.urandom(size))
        raise KeyboardInterrupt


def test_a_finished_stream_is_a_complete_gzip_of_what_was_written() -> None:
    data = os.urandom(3 << 20) + b"text " * 200_000
    sink = io.BytesIO()
    with gzip_writer(sink, 1) as stream:
        stream.write(data)
    # ... followed by the tail's tar block of zeros, which tar readers take as padding
    assert gzip.decompress(sink.getvalue()) == data + bytes(TAIL_CONTENT)
    assert not encoding_threads()


def test_an_exception_inside_the_block_abandons_the_stream_and_stops_its_workers() -> None:
    sink = io.BytesIO()
    with pytest.raises(KeyboardInterrupt):
        interrupt_a_stream(sink, 12 << 20)
    written = len(sink.getvalue())
    assert written  # members were written before the interrupt
    assert not encoding_threads()
    with pytest.raises(EOFError):  # no trailer: never mistaken for a whole archive
        gzip.decompress(sink.getvalue())
    assert len(sink.getvalue()) == written  # nothing reaches the sink afterwards


def test_a_stream_interrupted_before_any_member_is_whole_writes_nothing() -> None:
    sink = io.BytesIO()
    with pytest.raises(KeyboardInterrupt):
        interrupt_a_stream(sink, 1 << 20, threads=1)
    assert not encoding_threads()
    assert not sink.getvalue()
