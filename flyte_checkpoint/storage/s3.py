"""S3 (and S3-compatible stores) through s3fs: one-request loads from a streamed GET."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Mapping
from typing import IO, Any, cast

from fsspec.asyn import sync

from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreProfile, our_metadata
from flyte_checkpoint.storage.remote_errors import classify
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS

logger = logging.getLogger("flyte_checkpoint")

PROFILE = StoreProfile(
    implementation="s3fs:S3FileSystem",
    extra="s3",
    # s3fs holds about three copies of a part while it goes out (its buffer, the part cut
    # from it, aiohttp's copy of that): 16 MiB parts put S3 saves near 180 MiB peak RSS,
    # 8 MiB (the AWS CLI's part size) about 140. Larger objects grow them: see part_size.
    block_size=8 << 20,
    metadata_argument="Metadata",
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
    max_parts=10_000,
)


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


class StreamedS3Object(io.RawIOBase):
    """An S3 object read front to back through one streamed GET.

    s3fs's read-ahead file holds a whole block as one ``bytes`` while aiohttp gathers the next
    one (about four blocks resident: 64 MiB at 16 MiB blocks), and it sends a ranged GET per
    block, which S3-compatible servers such as moto answer by copying the whole object each
    time. A streamed body holds only what aiohttp buffers from the socket. The GET's own
    response describes the object (size, ETag, metadata), so a load is one request, not a HEAD
    for the description, another for the metadata and then the GET. A body that breaks off is
    reopened where it stopped, pinned to the ETag of the first response, so a resumed read
    cannot continue into a replacement object (the store answers 412, which the caller's retry
    takes as transient and starts over).
    """

    def __init__(self, fs: Any, uri: str) -> None:
        super().__init__()
        self._fs = fs
        self._uri = uri
        self._bucket, self._key, self._version_id = fs.split_path(uri)
        self._size = 0
        self._etag: str | None = None
        self._offset = 0
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def open(self) -> ObjectInfo:
        """Send the GET; describe the object from its response (``FileNotFoundError`` if absent)."""
        response = sync(self._fs.loop, self._open)
        info = object_info(self._uri, response)
        self._size, self._etag = info.size, info.version
        return info

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as view, view.cast("B") as target:
            # One trip to fsspec's event-loop thread fills the whole buffer, not one per socket read.
            return int(sync(self._fs.loop, self._fill, target))

    def close(self) -> None:
        if self._body is not None:
            try:
                sync(self._fs.loop, self._drop_body)
            except Exception as exc:
                # Only a connection that is not handed back to the pool; the read itself is over.
                logger.debug("could not release the GET of %s: %r", self._uri, exc)
        super().close()

    async def _open(self) -> Mapping[str, Any]:
        pinned = {"IfMatch": self._etag} if self._etag else {}
        if self._version_id:
            pinned["VersionId"] = self._version_id
        if self._offset:
            pinned["Range"] = f"bytes={self._offset}-"
        response: Mapping[str, Any] = await self._fs._call_s3(
            "get_object", Bucket=self._bucket, Key=self._key, **pinned
        )
        self._body = response["Body"]
        return response

    async def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.close()

    async def _fill(self, target: memoryview) -> int:
        """Fill ``target``, short only at the object's end; reopen a body that breaks off."""
        filled = failures = 0
        while filled < len(target) and self._offset < self._size:
            try:
                if self._body is None:
                    await self._open()
                chunk = await self._body.read(len(target) - filled)
            except Exception as exc:
                await self._drop_body()
                failures += 1
                if classify(exc) != "transient" or failures >= REQUEST_ATTEMPTS:
                    raise
                await asyncio.sleep(min(0.1 * 2 ** (failures - 1), 2.0))
                continue
            if not chunk:  # shorter than the response said: the size check at end-of-file reports it
                break
            failures = 0
            target[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            self._offset += len(chunk)
        return filled


class S3Backend(FsspecBackend):
    """S3: loads are one streamed GET, ``info`` one HEAD that includes the metadata."""

    protocol = "s3"
    profile = PROFILE

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        self.fs.retries = int(own["retries"])

    def _open_stream(self, uri: str) -> tuple[IO[bytes], ObjectInfo] | None:
        streamed = StreamedS3Object(self.fs, uri)
        with self._errors(uri, "loading"):
            try:
                info = streamed.open()
            except FileNotFoundError:
                return None
        return cast(IO[bytes], streamed), info

    def info(self, uri: str) -> ObjectInfo | None:
        # One HEAD: s3fs's info() leaves out the user metadata, which cost a second HEAD.
        bucket, key, version_id = self.fs.split_path(uri)
        versioned = {"VersionId": version_id} if version_id else {}
        with self._errors(uri, "inspecting"):
            try:
                response = sync(
                    self.fs.loop, self.fs._call_s3, "head_object", Bucket=bucket, Key=key, **versioned
                )
            except FileNotFoundError:
                return None
        return object_info(uri, response)
