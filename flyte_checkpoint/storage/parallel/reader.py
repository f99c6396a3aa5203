"""The parallel download: ranged reads in flight, handed out in order, pinned to one version."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import io
from dataclasses import dataclass
from typing import Any, TypeVar

from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.deadline import TransferBound
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.contract import (
    RangeBody,
    RangeSource,
)
from flyte_checkpoint.storage.parallel.retries import with_retries
from flyte_checkpoint.storage.parallel.sizing import first_range_size, range_size_for

T = TypeVar("T")

# -- downloads --------------------------------------------------------------------------------


@dataclass
class _Range:
    storage: bytearray
    """The reusable buffer; :attr:`buffer` is the part of it this range fills."""
    buffer: memoryview
    future: concurrent.futures.Future[None]
    consumed: int = 0


class ParallelReader(io.RawIOBase):
    """An object read by up to ``max_concurrency`` ranged GETs in flight, handed out in order.

    Wrap it in :class:`~flyte_checkpoint.storage.base.VerifyingReader`: it reads like a plain
    stream from the start to the end. Every range after the first is pinned to the version the
    first response reported; a range that fails is retried on its own; memory stays at
    ``max_concurrency`` buffers of at most ``part_size``, each reused for the range after the
    next ones. The first GET asks for :func:`~.sizing.first_range_size` bytes; the rest of the
    object is cut as :func:`~.sizing.range_size_for` plans, so every connection carries an equal
    share to the end.
    """

    def __init__(
        self,
        source: RangeSource,
        info: ObjectInfo,
        first: RangeBody,
        settings: TransferSettings,
        *,
        deadline: TransferBound | None = None,
        first_length: int | None = None,
    ) -> None:
        super().__init__()
        self.info = info
        self._source = source
        self._policy = settings.policy()
        first_length = first_range_size(settings) if first_length is None else first_length
        self._range_size = range_size_for(settings, info.size, first_length)
        self._deadline = deadline or settings.deadline(source.uri, "loading", source.loop, info.size)
        self._deadline.allow_for(info.size)
        self._ranges: collections.deque[_Range] = collections.deque()
        self._next_start = 0
        self._schedule(bytearray(min(first_length, info.size)), first)
        for _ in range(settings.max_concurrency - 1):
            if self._next_start >= info.size:
                break
            self._schedule(bytearray(self._length_from(self._next_start)))

    @classmethod
    def open(
        cls, source: RangeSource, settings: TransferSettings, *, deadline: TransferBound | None = None
    ) -> ParallelReader | None:
        """Send the first GET and start the others; ``None`` when there is no object."""
        deadline = deadline or settings.deadline(source.uri, "loading", source.loop)
        first_length = first_range_size(settings)
        opened = deadline.result(deadline.submit(source.open(first_length)))
        if opened is None:
            deadline.finish()
            return None
        info, first = opened
        return cls(source, info, first, settings, deadline=deadline, first_length=first_length)

    def _length_from(self, start: int) -> int:
        """The length of the range that starts at ``start`` (the plan of :func:`range_size_for`)."""
        return min(self._range_size, self.info.size - start)

    def _schedule(self, storage: bytearray, first: RangeBody | None = None) -> None:
        """Fetch the next range into ``storage`` (its length, at the start; else the plan's)."""
        start = self._next_start
        length = len(storage) if first is not None else self._length_from(start)
        if len(storage) < length:
            storage = bytearray(length)  # the first range's buffer is smaller than the others
        view = memoryview(storage)[:length]
        self._next_start += length
        future = self._deadline.submit(self._fill(start, view, first))
        self._ranges.append(_Range(storage, view, future))

    async def _fill(self, start: int, into: memoryview, body: RangeBody | None) -> None:
        """Fill ``into`` with the bytes from ``start``; a body cut off resumes where it stopped."""
        filled = 0
        version = self.info.version
        describe = f"reading bytes {start}-{start + len(into) - 1} of {self.info.uri}"

        async def attempt() -> None:
            nonlocal body, filled
            try:
                while filled < len(into):
                    if body is None:
                        body = await self._source.get_range(start + filled, len(into) - filled, version)
                    count = await body.readinto(into[filled:])
                    if not count:
                        raise ConnectionResetError(f"the response ended {len(into) - filled} bytes early")
                    filled += count
            finally:
                # A retry resumes with a new GET from where this one stopped.
                done, body = body, None
                if done is not None:
                    with contextlib.suppress(Exception):
                        await done.aclose()

        await with_retries(self._policy, describe, attempt)

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as given, given.cast("B") as target:
            while self._ranges:
                head = self._ranges[0]
                self._deadline.result(head.future)
                available = len(head.buffer) - head.consumed
                if available and len(target):
                    count = min(len(target), available)
                    target[:count] = head.buffer[head.consumed : head.consumed + count]
                    head.consumed += count
                    if head.consumed == len(head.buffer):
                        self._recycle()
                    return count
                if not len(target):
                    return 0
                self._recycle()
            return 0

    def _recycle(self) -> None:
        """The head range was handed out: its buffer fetches the next range not yet asked for."""
        head = self._ranges.popleft()
        if self._next_start < self.info.size:
            self._schedule(head.storage)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """Cancel the ranges still in flight (their connections are closed, not reused)."""
        while self._ranges:
            self._ranges.popleft().future.cancel()
        self._deadline.finish()
        super().close()
