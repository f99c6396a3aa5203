"""What a store adapter supplies to the parallel writer and reader (S3, GCS, Azure each have one in
:mod:`flyte_checkpoint.storage.stores`), and the error a pinned read raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from flyte_checkpoint.errors import CheckpointUnavailableError
from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.parallel.bodies import PartBody

T = TypeVar("T")


class ObjectReplacedError(CheckpointUnavailableError):
    """The object was replaced while it was being read; loading again reads the new one whole."""


# -- the store's side -------------------------------------------------------------------------


class UploadTarget(Protocol):
    """One destination object, as a store adapter uploads it (S3 multipart, Azure blocks...)."""

    @property
    def uri(self) -> str: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the store client runs on."""

    @property
    def max_parts(self) -> int: ...

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        """Store ``body`` as the whole object in one request."""

    async def create(self, metadata: Mapping[str, str]) -> str:
        """Start a multipart upload; return its id."""

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        """Send part ``number`` (1-based) from ``body``; return the receipt the completion needs (ETag)."""

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        """Publish the object from its parts, in order: the one atomic step."""

    async def abort(self, upload_id: str) -> None:
        """Discard the upload and its parts; absent is fine."""

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Abort other uploads to this object started more than ``older_than`` s ago; their count."""

    @property
    def lost_creates(self) -> int:
        """Requests to start an upload that the client retried after their answer was lost (each
        may have started an upload whose id never came back); 0 where starting sends none."""

    async def unfinished(self) -> list[str]:
        """The ids of the uploads to this object not yet completed or aborted, in the order they
        were started; empty where no upload can start without its id coming back."""

    async def holds_parts(self, upload_id: str) -> bool:
        """Whether the upload has stored a part (absent: ``False``)."""

    async def discard_unfinished(self) -> int:
        """Abort every unfinished upload to this object (only for one no writer is saving); their count."""


class RangeBody(Protocol):
    """A response body being received (aiobotocore's ``StreamingBody`` is one)."""

    async def readinto(self, b: memoryview, /) -> int: ...

    async def aclose(self) -> None: ...


class RangeSource(Protocol):
    """One stored object, as a store adapter reads it by ranges."""

    @property
    def uri(self) -> str: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        """GET the first ``length`` bytes; ``info`` describes the whole object (its size, version
        and metadata); ``None`` when there is no object."""

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        """GET ``length`` bytes from ``start`` of the object as it was at ``version``; raise
        :class:`ObjectReplacedError` when it has been replaced since."""
