"""S3 (and S3-compatible stores) through s3fs's client: parallel part uploads, ranged loads.

Saves and loads move their bytes with :mod:`~flyte_checkpoint.storage.parallel` on the S3
adapter below (:class:`S3Object`; ``max_concurrency`` parts or ranges in flight, see
:class:`~flyte_checkpoint.storage.options.TransferSettings`); the rest (``info``, copy,
listing, deletes) goes through s3fs.

The adapter's requests go to the aiobotocore client s3fs holds directly, not through
``S3FileSystem._call_s3``: s3fs would retry each one ``fs.retries`` times on top of botocore's
retries and of the per-part budget :mod:`~flyte_checkpoint.storage.parallel` keeps. The client still
gets s3fs's request defaults (``s3_additional_kwargs`` such as server-side encryption, requester
pays) and its session handling.

Parts go out as the file-like :class:`~flyte_checkpoint.storage.parallel.bodies.PartBody` the writer
hands over (a view of its buffer, or a range of the file being saved). botocore adds ``Expect:
100-continue`` to every request with a file-like body, which costs a round trip per part before any
byte is sent: the handler is removed from the client. An object smaller than one part goes out as
``bytes``: one write of headers and body, without aiohttp's two thread-pool hops for a file-like
payload.
"""

from __future__ import annotations

import asyncio
import base64
import re
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, cast

from fsspec.asyn import sync

from flyte_checkpoint.storage.base import DIGEST_KEY, ObjectInfo
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.bodies import PartBody
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError, RangeBody
from flyte_checkpoint.storage.parallel.retries import mark_retried_by_client
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS
from flyte_checkpoint.storage.stores.fsspec_store import (
    FsspecBackend,
    StoreProfile,
    merged_options,
    our_metadata,
)

PROFILE = StoreProfile(
    implementation="s3fs:S3FileSystem",
    extra="s3",
    metadata_at_commit=False,
    server_side_copy=True,
    defaults={
        "config_kwargs": {
            "connect_timeout": 10,
            "read_timeout": 120,
            "retries": {"max_attempts": REQUEST_ATTEMPTS, "mode": "standard"},
        }
    },
    # s3fs's own retry loop repeats botocore's: off (one try), so the budget stays where
    # storage/retry.py says. Set on the instance: its constructor ignores ``retries=``.
    own_options={"retries": 1},
)


class S3Backend(FsspecBackend):
    """S3: parallel saves and loads; ``info`` is one HEAD that includes the metadata."""

    protocol = "s3"
    profile = PROFILE
    keeps_unfinished_uploads = True

    def _defaults(self, transfer: TransferSettings) -> Mapping[str, Any]:
        # botocore's pool would make parts beyond its 10 connections queue for one.
        return merged_options(self.profile.defaults, pool_options(transfer))

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        self.fs.retries = int(own["retries"])

    def __init__(
        self, storage_options: Mapping[str, Any] | None = None, transfer: TransferSettings | None = None
    ) -> None:
        super().__init__(storage_options, transfer)
        self.transfer = s3_settings(self.transfer)

    def parallel_object(self, uri: str) -> S3Object:
        return S3Object(self.fs, uri)

    def info(self, uri: str) -> ObjectInfo | None:
        # One HEAD: s3fs's info() leaves out the user metadata, which cost a second HEAD.
        bucket, key, version_id = self.fs.split_path(uri)
        versioned = {"VersionId": version_id} if version_id else {}
        with self._bounded(uri, "inspecting"):
            try:
                response = sync(
                    self.fs.loop, self.fs._call_s3, "head_object", Bucket=bucket, Key=key, **versioned
                )
            except FileNotFoundError:
                return None
        return object_info(uri, response)


# -- the parallel adapter ---------------------------------------------------------------------

MIN_PART_SIZE = 5 << 20
"""S3 refuses parts below 5 MiB, except the last."""
MAX_PARTS = 10_000
_CONTENT_RANGE = re.compile(r"bytes \d+-\d+/(\d+)")
_without_expect: weakref.WeakSet[Any] = weakref.WeakSet()


def _no_expect_continue(client: Any) -> None:
    """Stop ``client`` from sending ``Expect: 100-continue`` (one round trip per upload request)."""
    if client in _without_expect:
        return
    from botocore.handlers import add_expect_header

    client.meta.events.unregister("before-call.s3", add_expect_header)
    _without_expect.add(client)


def object_info(uri: str, response: Mapping[str, Any]) -> ObjectInfo:
    """Describe an object from its ``head_object`` or ``get_object`` response."""
    etag = response.get("ETag")
    return ObjectInfo(
        uri=uri,
        size=int(response.get("ContentLength") or 0),
        metadata=our_metadata(response.get("Metadata") or {}),
        version=str(etag) if etag is not None else None,
        modified=response.get("LastModified"),
    )


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status else None
    return None


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


class S3Object:
    """One S3 key, as :class:`ParallelWriter` uploads it and :class:`ParallelReader` reads it."""

    def __init__(self, fs: Any, uri: str) -> None:
        self._fs = fs
        self.uri = uri
        self._bucket, self._key, self._version_id = fs.split_path(uri)
        self.max_parts = MAX_PARTS
        self.lost_creates = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return cast(asyncio.AbstractEventLoop, self._fs.loop)

    async def _client(self) -> Any:
        fs = self._fs
        await fs.set_session()
        client = await fs.get_s3(self._bucket)
        _no_expect_continue(client)
        return client

    async def _call(self, operation: str, **params: Any) -> Any:
        return await self._request(await self._client(), operation, **params)

    async def _request(self, client: Any, operation: str, **params: Any) -> Any:
        """``operation`` on this key through ``client`` (from :meth:`_client`), with s3fs's defaults."""
        method = getattr(client, operation)
        try:
            return await method(
                **self._fs._get_s3_method_kwargs(method, Bucket=self._bucket, Key=self._key, **params)
            )
        except Exception as exc:
            # botocore tried it REQUEST_ATTEMPTS times already (its max_attempts).
            mark_retried_by_client(exc)
            raise

    # uploads

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        # One PutObject publishes the object atomically. The copy is of less than one part.
        client = await self._client()
        checksum = self._store_checked(client, metadata)
        await self._request(client, "put_object", Body=bytes(body), Metadata=dict(metadata), **checksum)

    def _store_checked(self, client: Any, metadata: Mapping[str, str]) -> dict[str, str]:
        """The CRC32 recorded in ``metadata``, as PutObject's checksum parameter (same value, base64).

        S3 then refuses a body that does not match the digest the object will carry, so a save
        damaged between our digest and the store fails and keeps the previous object instead of
        publishing one that only the next load finds damaged. botocore would send a CRC32 of its
        own otherwise (one more pass of its Python per request). Nothing is added when the
        user's ``s3_additional_kwargs`` choose a checksum (S3 takes one per request), nor when
        checksums are off in botocore's config (``request_checksum_calculation`` "when_required",
        also from ``AWS_REQUEST_CHECKSUM_CALCULATION``): the way to reach S3-compatible stores
        that refuse ``x-amz-checksum-*`` headers, which a modelled parameter would still send.
        """
        if any(key.startswith("Checksum") for key in getattr(self._fs, "s3_additional_kwargs", {})):
            return {}
        if getattr(client.meta.config, "request_checksum_calculation", None) == "when_required":
            return {}
        algorithm, _, hex_value = metadata.get(DIGEST_KEY, "").partition(":")
        if algorithm != "crc32":  # what every writer records (storage/digests.py)
            return {}
        return {"ChecksumCRC32": base64.b64encode(bytes.fromhex(hex_value)).decode("ascii")}

    async def create(self, metadata: Mapping[str, str]) -> str:
        response = await self._call("create_multipart_upload", Metadata=dict(metadata))
        # botocore's retries of this request: each try whose answer was lost (a reset, a
        # timeout) may have started an upload whose id never came back.
        self.lost_creates += int(response.get("ResponseMetadata", {}).get("RetryAttempts") or 0)
        return str(response["UploadId"])

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        response = await self._call("upload_part", UploadId=upload_id, PartNumber=number, Body=body)
        return str(response["ETag"])

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        # The metadata was given when the upload started; S3 cannot change it here.
        parts = [{"PartNumber": number, "ETag": etag} for number, etag in receipts]
        await self._call("complete_multipart_upload", UploadId=upload_id, MultipartUpload={"Parts": parts})

    async def abort(self, upload_id: str) -> None:
        try:
            await self._call("abort_multipart_upload", UploadId=upload_id)
        except Exception as exc:
            if _code(exc) != "NoSuchUpload":
                raise

    async def _listed(self) -> list[tuple[str, datetime | None]]:
        """This key's unfinished uploads (exact key), oldest first as S3 lists them, with their starts."""
        found: list[tuple[str, datetime | None]] = []
        markers: dict[str, str] = {}
        client = await self._client()
        while True:
            page = await client.list_multipart_uploads(Bucket=self._bucket, Prefix=self._key, **markers)
            for upload in page.get("Uploads", []):
                if upload.get("Key") == self._key:
                    initiated = upload.get("Initiated")
                    found.append(
                        (str(upload["UploadId"]), initiated if isinstance(initiated, datetime) else None)
                    )
            if not page.get("IsTruncated"):
                return found
            markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    async def unfinished(self) -> list[str]:
        # S3 lists the uploads of one key in the order they were started.
        return [upload_id for upload_id, _ in await self._listed()]

    async def holds_parts(self, upload_id: str) -> bool:
        try:
            page = await self._call("list_parts", UploadId=upload_id, MaxParts=1)
        except Exception as exc:
            if _code(exc) == "NoSuchUpload":
                return False
            raise
        return bool(page.get("Parts"))

    async def discard_unfinished(self) -> int:
        listed = await self.unfinished()
        for upload_id in listed:
            await self.abort(upload_id)
        return len(listed)

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Abort the incomplete uploads to this key that killed saves left (not ``keep``).

        Ages are read on the store's clock: against the start time the store gave ``keep``
        (this save's own upload), so a client whose clock runs ahead cannot make another save's
        running upload look stale. The client's clock is used only if ``keep`` is not listed.
        """
        listed = await self._listed()
        started = next((initiated for upload_id, initiated in listed if upload_id == keep), None)
        cutoff = (started or datetime.now(timezone.utc)) - timedelta(seconds=older_than)
        stale = [
            upload_id
            for upload_id, initiated in listed
            if upload_id != keep and initiated is not None and initiated <= cutoff
        ]
        for upload_id in stale:
            await self.abort(upload_id)
        return len(stale)

    # downloads

    def _pinned(self, version: str | None) -> dict[str, str]:
        pinned = {"IfMatch": version} if version else {}
        if self._version_id:
            pinned["VersionId"] = self._version_id
        return pinned

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        pinned = self._pinned(None)
        try:
            response = await self._call("get_object", Range=f"bytes=0-{length - 1}", **pinned)
        except FileNotFoundError:
            return None
        except Exception as exc:
            if _code(exc) in ("NoSuchKey", "NoSuchBucket"):
                return None
            if _status(exc) != 416:
                raise
            # An empty object has no byte 0 to ask for.
            response = await self._call("get_object", **pinned)
        info = object_info(self.uri, response)
        found = _CONTENT_RANGE.fullmatch(str(response.get("ContentRange") or ""))
        if found is not None:
            info = info.model_copy(update={"size": int(found.group(1))})
        elif info.size > length:
            response["Body"].close()
            raise ValueError(
                f"the S3 server holding {self.uri} ignored a ranged GET; parallel loads need "
                "Range support (every S3-compatible store has it)"
            )
        return info, cast(RangeBody, response["Body"])

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        try:
            response = await self._call(
                "get_object", Range=f"bytes={start}-{start + length - 1}", **self._pinned(version)
            )
        except Exception as exc:
            if _status(exc) == 412 or _code(exc) == "PreconditionFailed":
                raise ObjectReplacedError(
                    f"checkpoint {self.uri} was replaced while it was being read; load it again "
                    "to read the new version"
                ) from exc
            raise
        return cast(RangeBody, response["Body"])


def s3_settings(settings: TransferSettings) -> TransferSettings:
    """``settings`` with parts of at least S3's minimum part size (5 MiB, but for the last)."""
    if settings.part_size < MIN_PART_SIZE:
        return settings.model_copy(update={"part_size": MIN_PART_SIZE})
    return settings


def pool_options(settings: TransferSettings) -> dict[str, Any]:
    """s3fs options that give its client one connection per request in flight, and no more.

    botocore's pool holds 10 connections by default: more concurrent parts would queue for one,
    and a larger pool would let the upload's other requests (starting it, the stale-upload
    sweep) open connections beyond the parts in flight. The most in flight is
    ``max_concurrency`` or, for the save of a regular file, ``file_concurrency``. Merge these into
    the options the ``S3FileSystem`` is built with (the caller's own ``max_pool_connections`` wins).
    """
    in_flight = max(settings.max_concurrency, settings.file_concurrency)
    return {"config_kwargs": {"max_pool_connections": in_flight}}
