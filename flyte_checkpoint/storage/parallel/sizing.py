"""How large a parallel transfer's parts are, and how much memory its buffers hold."""

from __future__ import annotations

from typing import TypeVar

from flyte_checkpoint.storage.options import TransferSettings

T = TypeVar("T")

_MiB = 1 << 20
FIRST_RANGE = _MiB
"""The most a download's first GET asks for, before the object's size is known: an object this
small is one request, and a larger one is split evenly among all connections (see
:func:`range_size_for`) instead of waiting for one connection's whole part."""
_PART_GROWTH = 1024
"""An upload of unknown length makes each part at least 1/1024 of what was written before it, so
an object of any size the store accepts fits in its part limit (S3: 5 TiB in 10,000 parts)."""


def transfer_memory(settings: TransferSettings) -> int:
    """Bytes of buffers one save or load holds at most: ``(max_concurrency + 1) * part_size``.

    An upload fills one buffer while up to ``max_concurrency`` are in flight (so a finished part
    is replaced at once: with one buffer fewer, a connection idled while the next part was
    filled, a directory save measured 18% slower); a download fills ``max_concurrency``; the
    save of a regular file holds none (its parts are read from the file as they are sent). The
    process adds its own baseline (interpreter, client libraries) and the HTTP library's socket
    buffers, about 0.5 MiB per connection.
    """
    return (settings.max_concurrency + 1) * settings.part_size


def part_size_for(settings: TransferSettings, max_parts: int, expected: int | None, sent: int) -> int:
    """The part size for an upload of ``expected`` bytes (``None``: unknown, ``sent`` so far)."""
    wanted = -(-expected // max_parts) if expected is not None else sent // _PART_GROWTH
    return max(settings.part_size, -(-wanted // _MiB) * _MiB)


def first_range_size(settings: TransferSettings) -> int:
    """The length a download's first GET asks for: :data:`FIRST_RANGE`, or less with smaller parts."""
    return min(FIRST_RANGE, settings.part_size)


def range_size_for(settings: TransferSettings, size: int, first: int) -> int:
    """Bytes per ranged GET after the first (of ``first`` bytes) when the object holds ``size``.

    The object is cut into shares of equal size, as many as ``max_concurrency`` connections
    times the fewest rounds that keep every share within ``part_size``, so every connection is
    busy until the end: 54 MiB on 8 connections is 8 shares of 6.7 MiB (one round), not 7 parts
    of 8 MiB with one connection idle, nor a last round that only some connections carry. The
    first connection's share is its first GET plus the object's last range, which is the
    share less ``first``. No range is shorter than ``first``, so a small object is a few
    requests, not ``max_concurrency`` tiny ones.
    """
    slots = settings.max_concurrency
    rounds = max(1, -(-size // (slots * settings.part_size)))
    return max(first, -(-size // (slots * rounds)))
