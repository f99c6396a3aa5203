"""Azure Blob Storage through adlfs, with a blob client whose every call is time-bounded: blocks
staged in parallel and committed as one ordered block list, parallel ranged loads pinned to one
ETag. The backend first, then its adapter for :mod:`~flyte_checkpoint.storage.parallel`
(:class:`AzureBlob`), on the client adlfs holds.

Requests go to the ``azure.storage.blob.aio`` client that :func:`bound_azure_client`
gave adlfs (time-bounded, short retry budget), on adlfs's event loop.

Uploads: Put Block (``stage_block``) for every part, up to ``max_concurrency`` in flight, then
one Put Block List (``commit_block_list``) naming the blocks in order, with the metadata. The
blob appears atomically at that commit; staged blocks are never visible. Azure has no request
that discards a blob's uncommitted blocks (they are not objects of their own, so there is
nothing to list or delete per upload): the blob's next commit (Put Block List or Put Blob, that
is the next save) discards all of them, and Azure garbage-collects them after 7 days. So an
aborted or killed save leaves nothing a reader can see, and :meth:`AzureBlob.sweep_stale` has
nothing to do. A consequence: of two saves racing to one blob, the first to commit discards the
other's staged blocks and the other's commit fails (``InvalidBlockList``). That is raised as
:class:`BlocksDiscardedError`, transient, so the save is retried whole and the last save to
finish wins, as on S3 and GCS.

Block ids are 32 characters, as adlfs's are: Azure refuses a block whose id length differs from
the blob's other uncommitted blocks, which a killed save of either kind may have left.

Loads: ranged Get Blob requests pinned to the ETag of the first response (``If-Match``), so an
overwrite during a load fails it (HTTP 412) instead of mixing two versions. They go through the
SDK's generated operation, which streams the response (see :meth:`AzureBlob._get`): a private
attribute of the blob client (``_client``), stable across the SDK's 12.x releases but checked by
the tests on each upgrade.
"""

from __future__ import annotations

import asyncio
import email.utils
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar, cast

from flyte_checkpoint.errors import CheckpointUnavailableError
from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.parallel.bodies import PartBody
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError, RangeBody
from flyte_checkpoint.storage.parallel.retries import mark_retried_by_client
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS
from flyte_checkpoint.storage.stores.fsspec_store import (
    FsspecBackend,
    StoreObject,
    StoreProfile,
    our_metadata,
)

PROFILE = StoreProfile(
    implementation="adlfs:AzureBlobFileSystem",
    extra="azure",
    metadata_at_commit=True,
    server_side_copy=False,
    defaults={"connection_timeout": 10, "read_timeout": 120},
    # adlfs applies its timeouts to a few calls only and keeps the SDK's retry policy (15 s
    # first back-off), so the client is rebuilt with these bounds: see bound_azure_client.
    own_options={"retry_total": REQUEST_ATTEMPTS - 1, "retry_backoff": 1.0},
)


class AzureBackend(FsspecBackend):
    """Azure: blocks staged in parallel, metadata with the block list; the client gets explicit bounds."""

    protocol = "abfs"
    profile = PROFILE

    def parallel_object(self, uri: str) -> StoreObject:
        return AzureBlob(self.fs, uri)

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        bound_azure_client(self.fs, options, own)


def bound_azure_client(fs: Any, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    """Give adlfs a blob client whose every call has a time bound and a short retry budget."""
    from azure.storage.blob.aio import BlobServiceClient

    bounds = {
        "retry_total": int(own["retry_total"]),
        "retry_connect": int(own["retry_total"]),
        "retry_read": int(own["retry_total"]),
        "retry_status": int(own["retry_total"]),
        "initial_backoff": float(own["retry_backoff"]),
        "increment_base": 2,
        "connection_timeout": options["connection_timeout"],
        "read_timeout": options["read_timeout"],
    }
    # Every credential kind adlfs knows gets the same bounded client: a connection string; an
    # account URL with a key or a credential object (DefaultAzureCredential, a service
    # principal); with a SAS token; or anonymous. A SAS client kept the SDK's policy and took
    # 7 minutes to give up on an unreachable host.
    connection_string = getattr(fs, "connection_string", None)
    if connection_string:
        fs.service_client = BlobServiceClient.from_connection_string(connection_string, **bounds)
        return
    account_url = getattr(fs, "account_url", None)
    if not account_url:
        return  # adlfs could not build a client either; its own error stands
    credential = getattr(fs, "credential", None) or getattr(fs, "account_key", None)
    sas_token = getattr(fs, "sas_token", None)
    if credential is None and sas_token:
        account_url += sas_token if sas_token.startswith("?") else f"?{sas_token}"
    fs.service_client = BlobServiceClient(account_url, credential=credential, **bounds)


# -- the parallel adapter ---------------------------------------------------------------------

T = TypeVar("T")


async def _retried_by_the_sdk(request: Awaitable[T]) -> T:
    """``request``'s result; a failure is marked as already retried by the SDK (its
    ``retry_total``), so the part layer does not repeat it (see :mod:`.retry`)."""
    try:
        return await request
    except Exception as exc:
        mark_retried_by_client(exc)
        raise


MAX_BLOCKS = 50_000
"""Azure's cap on committed blocks per blob."""


class _RangeStream:
    """One ranged Get Blob response being received, as a :class:`RangeBody`."""

    def __init__(self, response: Any, chunks: Any) -> None:
        self._response = response
        self._chunks = chunks
        self._left = memoryview(b"")

    async def readinto(self, b: memoryview, /) -> int:
        if not self._left:
            try:
                self._left = memoryview(await self._chunks.__anext__())
            except StopAsyncIteration:
                return 0
        count = min(len(b), len(self._left))
        b[:count] = self._left[:count]
        self._left = self._left[count:]
        return count

    async def aclose(self) -> None:
        internal = getattr(self._response, "internal_response", None)
        if internal is not None:
            internal.close()  # aiohttp's response: the connection is dropped, not reused


class BlocksDiscardedError(CheckpointUnavailableError):
    """A concurrent save to the same blob committed first, discarding this save's staged blocks."""


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class AzureBlob:
    """One blob, as :class:`~flyte_checkpoint.storage.parallel.writer.ParallelWriter` uploads it and
    :class:`~flyte_checkpoint.storage.parallel.reader.ParallelReader` reads it."""

    def __init__(self, fs: Any, uri: str) -> None:
        self._fs = fs
        self.uri = uri
        self._container, self._blob, self._version_id = fs.split_path(uri)
        self.max_parts = MAX_BLOCKS
        self.lost_creates = 0
        """Always 0: starting an upload sends no request (see :meth:`create`)."""
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
        await _retried_by_the_sdk(
            self._blob_client().upload_blob(
                bytes(body), length=len(body), overwrite=True, metadata=dict(metadata), max_concurrency=1
            )
        )

    async def create(self, metadata: Mapping[str, str]) -> str:
        # Nothing to start on the server: blocks are staged against the blob's name.
        return uuid.uuid4().hex[:24]

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        block_id = f"{upload_id}{number:08d}"
        # A file-like body goes out in chunks, not as a copy of the part (see PartBody).
        await _retried_by_the_sdk(self._blob_client().stage_block(block_id, body, length=len(body)))
        return block_id

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        from azure.core.exceptions import HttpResponseError
        from azure.storage.blob import BlobBlock

        blocks = [BlobBlock(block_id=block_id) for _, block_id in receipts]
        try:
            # The one atomic step: the blob becomes these blocks, in this order, with this metadata.
            await self._blob_client().commit_block_list(blocks, metadata=dict(metadata))
        except HttpResponseError as exc:
            if getattr(exc, "error_code", None) != "InvalidBlockList":
                raise
            raise BlocksDiscardedError(
                f"another save to {self.uri} committed first and so discarded the blocks this save "
                "had staged; saving again uploads them anew (the last save to finish wins)"
            ) from exc

    async def abort(self, upload_id: str) -> None:
        """Nothing to do: uncommitted blocks are invisible and Azure discards them (see above)."""

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Nothing to sweep: Azure offers no way to discard uncommitted blocks but a commit."""
        return 0

    async def unfinished(self) -> list[str]:
        # An upload is only a block-id prefix this process chose: no answer can be lost.
        return []

    async def holds_parts(self, upload_id: str) -> bool:
        return False  # never asked: unfinished() lists nothing

    async def discard_unfinished(self) -> int:
        """Nothing to discard (see the module docstring): only a commit discards uncommitted
        blocks, and a commit here would replace the object an earlier attempt saved (or create
        an empty one a load would take for a checkpoint). Azure deletes them after 7 days."""
        return 0

    # downloads

    async def _get(self, start: int, length: int | None, etag: str | None) -> tuple[Any, _RangeStream]:
        """Send a Get Blob for ``length`` bytes from ``start`` (``None``: no range); return the
        response headers and its body, not yet received.

        The SDK's own ``download_blob`` receives a range whole into one ``bytes`` (joining the
        chunks first) before it hands any of it out: two more copies of every range in flight,
        which took loads past 200 MiB. Its generated operation streams: that is what runs here.
        """
        from azure.storage.blob._generated.models import ModifiedAccessConditions

        def streamed(pipeline_response: Any, chunks: Any, headers: Any) -> tuple[Any, _RangeStream]:
            response = pipeline_response.http_response
            return response.headers, _RangeStream(response, chunks)

        options: dict[str, Any] = {"cls": streamed}
        if length is not None:
            options["range"] = f"bytes={start}-{start + length - 1}"
        if etag is not None:
            options["modified_access_conditions"] = ModifiedAccessConditions(if_match=etag)
        if self._version_id:
            options["version_id"] = self._version_id
        headers, body = await _retried_by_the_sdk(self._blob_client()._client.blob.download(**options))
        return headers, body

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        try:
            try:
                headers, body = await self._get(0, length, None)
            except HttpResponseError as exc:
                if _status(exc) != 416:
                    raise
                # An empty blob has no byte 0 to ask for.
                headers, body = await self._get(0, None, None)
        except ResourceNotFoundError:
            return None
        total = str(headers.get("Content-Range") or "").rpartition("/")[2]
        metadata = {
            name[len("x-ms-meta-") :]: value
            for name, value in headers.items()
            if name.lower().startswith("x-ms-meta-")
        }
        modified = headers.get("Last-Modified")
        info = ObjectInfo(
            uri=self.uri,
            size=int(total) if total.isdigit() else int(headers.get("Content-Length") or 0),
            metadata=our_metadata(metadata),
            version=headers.get("ETag"),
            modified=email.utils.parsedate_to_datetime(modified) if modified else None,
        )
        return info, body

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        try:
            _, body = await self._get(start, length, version)
        except (HttpResponseError, ResourceNotFoundError) as exc:
            if isinstance(exc, ResourceNotFoundError) or _status(exc) == 412:
                raise ObjectReplacedError(
                    f"checkpoint {self.uri} was replaced while it was being read; load it again "
                    "to read the new version"
                ) from exc
            raise
        return body
