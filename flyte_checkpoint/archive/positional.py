"""Streams whose bytes can also be read at their offsets, from any thread.

A load reads an object as one stream, so that the store's digest covers every byte in order.
On local disk the same bytes can be read at any offset by any thread (``os.pread``), which lets
a load read members on its pool instead of on the one thread that splits the object: on a
stored (incompressible) object that read is most of the serial work. A stream offers this with a
``positional_reads()`` method; the reader that uses it must still account for every byte, in
order, with :meth:`PositionalReads.skip`, so the stream's digest and size checks see the whole
object.
"""

from __future__ import annotations

from typing import Protocol, cast


class PositionalReads(Protocol):
    """Reads at offsets of a stream, beside its reads in order."""

    def consumed(self) -> int:
        """Bytes of the stream consumed so far (read in order or skipped)."""
        ...

    def size(self) -> int:
        """Bytes in the stream now (where a reader looks for what ends it: a hint, since the
        bytes read in order and skipped are what the stream's own checks count)."""
        ...

    def read_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (from the stream's start), fewer only at its end;
        safe from any thread, and without moving the stream."""
        ...

    def reserve(self, length: int) -> None:
        """The next ``length`` bytes not yet reserved are read with :meth:`read_at` and will be
        skipped (:meth:`skip`), but what they hold may be handed on before: a stream that counts
        the bytes behind what its reader handed on counts them now (same thread as
        :meth:`skip`)."""
        ...

    def skip(self, length: int, crc: int) -> None:
        """Move the stream past its next ``length`` bytes, which were read with :meth:`read_at`
        and whose CRC-32 is ``crc``, as if they had been read in order (same thread as the
        reads in order)."""
        ...


def positional_reads(source: object) -> PositionalReads | None:
    """What ``source`` offers for reads at offsets, or ``None`` when it cannot."""
    offer = getattr(source, "positional_reads", None)
    return cast(PositionalReads | None, offer()) if callable(offer) else None
