"""Azure Blob Storage for :mod:`~flyte_checkpoint.storage.parallel`, on the client adlfs holds.

Requests go to the ``azure.storage.blob.aio`` client that :func:`~.azure.bound_azure_client`
gave adlfs (time-bounded, short retry budget), on adlfs's event loop.

Uploads: Put Block (``stage_block``) for every part, up to ``max_concurrency`` in flight, then
one Put Block List (``commit_block_list``) naming the blocks in order, with the metadata. The
blob appears atomically at that commit; staged blocks are never visible. Azure has no request
that discards a blob's uncommitted blocks (they are not objects of their own, so there is
nothing to list or delete per upload): the blob's next commit (Put Block List or Put Blob, that
is the next save) discards all of them, and Azure garbage-collects them after 7 days. So an
aborted or killed save leaves nothing a reader can see, and :meth:`AzureBlob.sweep_stale` has
nothing to do. A consequence: of two saves racing to one blob, the first to commit discards the
other's staged blocks and the other fails (``InvalidBlockList``) instead of landing.

Block ids are 32 characters, as adlfs's are: Azure refuses a block whose id length differs from
the blob's other uncommitted blocks, which a killed save of either kind may have left.

Loads: ranged Get Blob requests pinned to the ETag of the first response
(``match_condition=IfNotModified``), so an overwrite during a load fails it (HTTP 412) instead
of mixing two versions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.fsspec_store import our_metadata
from flyte_checkpoint.storage.parallel import ObjectReplacedError, RangeBody

MAX_BLOCKS = 50_000
"""Azure's cap on committed blocks per blob."""


class _IntoView:
    """A writable stream over a memoryview: where the SDK's ``readinto`` copies a range to."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self.filled = 0

    def write(self, data: bytes) -> int:
        count = min(len(data), len(self._view) - self.filled)
        self._view[self.filled : self.filled + count] = memoryview(data)[:count]
        self.filled += count
        return count

    def seekable(self) -> bool:
        return False


class _RangeDownload:
    """One ranged download as a :class:`RangeBody`.

    The SDK receives a range whole before it hands out any of it (``StorageStreamDownloader``
    joins the response into one ``bytes``); from there it is copied once, into the reader's
    buffer.
    """

    def __init__(self, downloader: Any) -> None:
        self._downloader = downloader
        self._left = int(downloader.size)

    async def readinto(self, b: memoryview, /) -> int:
        if self._left <= 0:
            return 0
        if len(b) >= self._left:
            into = _IntoView(b)
            await self._downloader.readinto(into)
            count = into.filled
        else:
            data = await self._downloader.read(len(b))
            count = len(data)
            b[:count] = data
        self._left -= count
        return count

    async def aclose(self) -> None:
        self._downloader = None


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class AzureBlob:
    """One blob, as :class:`~.parallel.ParallelWriter` uploads it and
    :class:`~.parallel.ParallelReader` reads it."""

    def __init__(self, fs: Any, uri: str) -> None:
        self._fs = fs
        self.uri = uri
        self._container, self._blob, self._version_id = fs.split_path(uri)
        self.max_parts = MAX_BLOCKS
        self._client: Any = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return cast(asyncio.AbstractEventLoop, self._fs.loop)

    def _blob_client(self) -> Any:
        if self._client is None:
            # Shares the service client's transport (connection pool) and its bounds.
            self._client = self._fs.service_client.get_blob_client(self._container, self._blob)
        return self._client

    # uploads

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        # One Put Blob publishes the blob atomically (and discards stale uncommitted blocks).
        # The SDK takes bytes or a stream; the copy is of less than one part.
        await self._blob_client().upload_blob(
            bytes(body), length=len(body), overwrite=True, metadata=dict(metadata), max_concurrency=1
        )

    async def create(self, metadata: Mapping[str, str]) -> str:
        # Nothing to start on the server: blocks are staged against the blob's name.
        return uuid.uuid4().hex[:24]

    async def upload_part(self, upload_id: str, number: int, body: memoryview) -> str:
        from flyte_checkpoint.storage.s3_parallel import _PartBody

        block_id = f"{upload_id}{number:08d}"
        # A file-like body goes out in chunks, not as a copy of the part (see s3_parallel).
        await self._blob_client().stage_block(block_id, _PartBody(body), length=len(body))
        return block_id

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        from azure.storage.blob import BlobBlock

        blocks = [BlobBlock(block_id=block_id) for _, block_id in receipts]
        # The one atomic step: the blob becomes these blocks, in this order, with this metadata.
        await self._blob_client().commit_block_list(blocks, metadata=dict(metadata))

    async def abort(self, upload_id: str) -> None:
        """Nothing to do: uncommitted blocks are invisible and Azure discards them (see above)."""

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Nothing to sweep: Azure offers no way to discard uncommitted blocks but a commit."""
        return 0

    # downloads

    def _download_options(self, version: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"max_concurrency": 1}
        if version is not None:
            from azure.core import MatchConditions

            options.update(etag=version, match_condition=MatchConditions.IfNotModified)
        if self._version_id:
            options["version_id"] = self._version_id
        return options

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        client = self._blob_client()
        unpinned = self._download_options(None)
        try:
            try:
                downloader = await client.download_blob(offset=0, length=length, **unpinned)
            except HttpResponseError as exc:
                if _status(exc) != 416:
                    raise
                # An empty blob has no byte 0 to ask for.
                downloader = await client.download_blob(**unpinned)
        except ResourceNotFoundError:
            return None
        properties = downloader.properties
        total = str(properties.content_range or "").rpartition("/")[2]
        info = ObjectInfo(
            uri=self.uri,
            size=int(total) if total.isdigit() else int(downloader.size),
            metadata=our_metadata(properties.metadata or {}),
            version=str(properties.etag) if properties.etag else None,
            modified=properties.last_modified,
        )
        return info, _RangeDownload(downloader)

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            downloader = await self._blob_client().download_blob(
                offset=start, length=length, **self._download_options(version)
            )
        except (ResourceModifiedError, ResourceNotFoundError) as exc:
            raise ObjectReplacedError(
                f"checkpoint {self.uri} was replaced while it was being read; load it again to "
                "read the new version"
            ) from exc
        return _RangeDownload(downloader)
