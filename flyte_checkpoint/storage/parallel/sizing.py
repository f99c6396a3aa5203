"""How large a parallel transfer's parts are, and how much memory its buffers hold."""

from __future__ import annotations

from typing import TypeVar

from flyte_checkpoint.storage.options import TransferSettings

T = TypeVar("T")

_MiB = 1 << 20
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
