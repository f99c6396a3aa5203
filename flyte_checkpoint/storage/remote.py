"""Object stores through fsspec (s3fs, gcsfs, adlfs): one streamed upload per object.

Atomicity: an object store publishes an object only when its single PUT, its multipart upload
(S3), its resumable upload (GCS) or its block list (Azure) completes, which happens in
``close()``. fsspec's ``__exit__`` and even garbage collection call ``close()``, completing the
upload with whatever was written so far when a save fails half-way — so this module never uses
``with`` for writes: a failure calls ``discard()`` (which aborts the multipart / resumable upload)
and marks the file closed so nothing later can complete it. The previous object stays intact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, cast

from fsspec.asyn import sync

from flyte_checkpoint.errors import BackendNotInstalledError
from flyte_checkpoint.storage.base import (
    DIGEST_KEY,
    FORMAT_KEY,
    FSYNC_OPTION,
    SIZE_KEY,
    Backend,
    ObjectInfo,
    ObjectWriter,
    VerifyingReader,
)
from flyte_checkpoint.storage.remote_errors import classify, translated_backend_errors
from flyte_checkpoint.uris import scheme_of

EXTRAS = {"s3": "s3", "gs": "gcs", "abfs": "azure"}
# The implementations are named, not looked up in fsspec's registry: other libraries (the Flyte
# SDK's flyte.init() registers obstore) replace the registry's s3/gs/abfs entries process-wide.
IMPLEMENTATIONS = {
    "s3": "s3fs:S3FileSystem",
    "gs": "gcsfs:GCSFileSystem",
    "abfs": "adlfs:AzureBlobFileSystem",
}
_CANONICAL = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs", "abfss": "abfs", "az": "abfs"}
_OUR_KEYS = (FORMAT_KEY, DIGEST_KEY, SIZE_KEY)


@dataclass(frozen=True)
class _Profile:
    """What differs between the three object stores, learnt against their real servers."""

    block_size: int
    """Upload part size: S3 needs >= 5 MiB parts, GCS multiples of 256 KiB."""
    metadata_argument: str
    """The ``open(..., "wb")`` keyword that attaches user metadata to the new object."""
    metadata_at_commit: bool
    """Whether metadata can still be set when the upload completes (Azure's block list can)."""
    server_side_copy: bool
    """Whether ``fs.copy`` finishes the copy before returning (Azure's may still be pending)."""
    defaults: Mapping[str, Any]
    """Storage options applied unless the caller gives their own: time bounds on every call."""
    own_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Options this module consumes itself (not passed to fsspec), with their defaults."""
    streamed_reads: bool = False
    """Whether loads read one streamed GET (:class:`_StreamedS3Object`), not fsspec's blocks."""
    max_parts: int | None = None
    """The store's cap on parts per upload; with one, parts grow past ``block_size`` (:func:`_part_size`)."""


_PROFILES = {
    "s3": _Profile(
        # s3fs holds about three copies of a part while it goes out (its buffer, the part cut
        # from it, aiohttp's copy of that): 16 MiB parts put S3 saves near 180 MiB peak RSS,
        # 8 MiB (the AWS CLI's part size) about 140. Larger objects grow them: see _part_size.
        block_size=8 << 20,
        metadata_argument="Metadata",
        metadata_at_commit=False,
        server_side_copy=True,
        defaults={
            "config_kwargs": {
                "connect_timeout": 10,
                "read_timeout": 120,
                "retries": {"max_attempts": 3, "mode": "standard"},
            }
        },
        # s3fs retries on top of botocore, and its constructor ignores ``retries=``.
        own_options={"retries": 5},
        streamed_reads=True,
        max_parts=10_000,
    ),
    "gs": _Profile(
        block_size=16 << 20,
        metadata_argument="metadata",
        metadata_at_commit=False,
        server_side_copy=True,
        defaults={"requests_timeout": 300},
    ),
    "abfs": _Profile(
        block_size=16 << 20,
        metadata_argument="metadata",
        metadata_at_commit=True,
        server_side_copy=False,
        defaults={"connection_timeout": 10, "read_timeout": 120},
        # adlfs applies its timeouts to a few calls only and keeps the SDK's retry policy (15 s
        # first back-off), so the client is rebuilt with these bounds: see _bound_azure_client.
        own_options={"retry_total": 3, "retry_backoff": 1.0},
    ),
}


_MiB = 1 << 20
_PART_GROWTH = 1024
"""An upload of unknown length makes each part at least 1/1024 of what was written before it:
8 MiB parts up to 8 GiB, and S3's 5 TiB object limit in about 7,600 parts of at most 5 GiB
(S3 allows 10,000; fixed 16 MiB parts stopped at 156 GiB, fixed 8 MiB parts would at 78 GiB)."""


def _part_size(profile: _Profile, expected: int | None, sent: int) -> int:
    """The part size for an upload of ``expected`` bytes (``None``: unknown, ``sent`` so far)."""
    if profile.max_parts is None:
        return profile.block_size
    wanted = -(-expected // profile.max_parts) if expected is not None else sent // _PART_GROWTH
    return max(profile.block_size, -(-wanted // _MiB) * _MiB)


def canonical_protocol(uri: str) -> str:
    """``s3``, ``gs`` or ``abfs`` for any of the URI schemes they serve."""
    return _CANONICAL[scheme_of(uri)]


def _copied(value: Any) -> Any:
    """``value`` with its nested dicts copied; other objects (credentials, sessions) are shared."""
    return {key: _copied(item) for key, item in value.items()} if isinstance(value, dict) else value


def _merged_options(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    # Deep copies: botocore's Config rewrites the ``retries`` dict it is given in place, which
    # changed these defaults after the first client, so fsspec's instance cache (keyed on the
    # options) missed and every later backend built a second client with its own parsed S3
    # service model, about 15 MiB that the cache then kept for the life of the process.
    options: dict[str, Any] = {key: _copied(value) for key, value in defaults.items()}
    for key, value in (given or {}).items():
        if isinstance(value, Mapping) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **_copied(dict(value))}
        else:
            options[key] = _copied(value)
    # Listings cached by fsspec never see objects other processes write: always ask the store.
    options.setdefault("use_listings_cache", False)
    return options


class FsspecWriter(ObjectWriter):
    """A streamed upload that becomes an object only when :meth:`commit` completes it."""

    def __init__(
        self,
        uri: str,
        scheme: str,
        handle: Any,
        profile: _Profile,
        metadata: Mapping[str, str],
        *,
        growing_parts: bool = False,
    ) -> None:
        super().__init__(uri)
        self.metadata.update(metadata)
        self._scheme = scheme
        self._handle = handle
        self._profile = profile
        self._growing_parts = growing_parts

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self._growing_parts:
            # fsspec cuts a part whenever its buffer reaches ``blocksize``, read at each write.
            self._handle.blocksize = _part_size(self._profile, None, self._size)
        with translated_backend_errors(self.uri, "saving", self._scheme):
            self._handle.write(data)

    def _commit(self) -> None:
        if self._profile.metadata_at_commit:
            # Azure sends these with the block list, in the same request that publishes the blob.
            self._handle.metadata.update(self.metadata)
        with translated_backend_errors(self.uri, "saving", self._scheme):
            self._handle.close()

    def _abort(self) -> None:
        try:
            with contextlib.suppress(Exception):
                self._handle.discard()
        finally:
            # discard() leaves some backends' files open, and close() -- or garbage collection --
            # of an open file would complete the upload: mark it closed so nothing can.
            self._handle.closed = True


class _StreamedS3Object(io.RawIOBase):
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
        info = _s3_object_info(self._uri, response)
        self._size, self._etag = info.size, info.version
        return info

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as view, view.cast("B") as target:
            # One trip to fsspec's event-loop thread fills the whole buffer, not one per socket read.
            return int(sync(self._fs.loop, self._fill, target))

    def close(self) -> None:
        if self._body is not None:
            with contextlib.suppress(Exception):
                sync(self._fs.loop, self._drop_body)
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
                if classify(exc) != "transient" or failures > int(getattr(self._fs, "retries", 5)):
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


def _our_metadata(raw: Mapping[str, Any]) -> dict[str, str]:
    # Stores and clients report metadata keys with hyphens where they were written with underscores.
    normalised = {key.lower().replace("-", "_"): str(value) for key, value in raw.items()}
    return {key: value for key, value in normalised.items() if key in _OUR_KEYS}


def _s3_object_info(uri: str, response: Mapping[str, Any]) -> ObjectInfo:
    """Describe an object from its ``head_object`` or ``get_object`` response."""
    etag = response.get("ETag")
    return ObjectInfo(
        uri=uri,
        size=int(response.get("ContentLength") or 0),
        metadata=_our_metadata(response.get("Metadata") or {}),
        version=str(etag) if etag is not None else None,
        modified=response.get("LastModified"),
    )


class FsspecBackend(Backend):
    """An object store reached through its fsspec implementation, with explicit options."""

    def __init__(self, protocol: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.protocol = _CANONICAL.get(protocol, protocol)
        self.profile = _PROFILES[self.protocol]
        self.records_digest_only_when_declared = not self.profile.metadata_at_commit
        options = _merged_options(self.profile.defaults, storage_options)
        options.pop(FSYNC_OPTION, None)  # a local-disk option; uploads are durable once complete
        own = {key: options.pop(key, default) for key, default in self.profile.own_options.items()}
        if own != dict(self.profile.own_options):
            # fsspec shares one instance per set of options, and these are set on the instance.
            options["skip_instance_cache"] = True
        try:
            module_name, _, class_name = IMPLEMENTATIONS[self.protocol].partition(":")
            self.fs = getattr(importlib.import_module(module_name), class_name)(**options)
        except ImportError as exc:
            extra = EXTRAS.get(self.protocol, "all")
            raise BackendNotInstalledError(
                f"{protocol}:// storage needs an fsspec backend that is not installed ({exc}); "
                f"install it with: pip install 'flyte-checkpoint[{extra}]'"
            ) from exc
        if self.protocol == "abfs":
            _bound_azure_client(self.fs, options, own)
        elif self.protocol == "s3":
            self.fs.retries = int(own["retries"])

    def _errors(self, uri: str, action: str) -> contextlib.AbstractContextManager[None]:
        return translated_backend_errors(uri, action, scheme_of(uri))

    def open_write(
        self,
        uri: str,
        metadata: Mapping[str, str],
        *,
        declared_digest: str | None = None,
        declared_size: int | None = None,
    ) -> ObjectWriter:
        at_open = dict(metadata)
        if declared_digest is not None and declared_size is not None:
            at_open.update({DIGEST_KEY: declared_digest, SIZE_KEY: str(declared_size)})
        with self._errors(uri, "saving"):
            handle = self.fs.open(
                uri,
                "wb",
                block_size=_part_size(self.profile, declared_size, 0),
                **{self.profile.metadata_argument: at_open},
            )
        # A known size fixes the part size up front; so does s3fs's ``fixed_upload_size`` (for
        # stores such as R2 that want all parts but the last of one size).
        growing = (
            self.profile.max_parts is not None
            and declared_size is None
            and not getattr(self.fs, "fixed_upload_size", False)
        )
        writer = FsspecWriter(uri, scheme_of(uri), handle, self.profile, metadata, growing_parts=growing)
        writer.declare(declared_digest, declared_size)
        return writer

    def open_read(self, uri: str) -> VerifyingReader | None:
        stream: IO[bytes]
        if self.profile.streamed_reads:
            streamed = _StreamedS3Object(self.fs, uri)
            with self._errors(uri, "loading"):
                try:
                    info = streamed.open()
                except FileNotFoundError:
                    return None
            stream = cast(IO[bytes], streamed)
        else:
            found = self.info(uri)
            if found is None:
                return None
            info = found
            with self._errors(uri, "loading"):
                try:
                    stream = self.fs.open(
                        uri, "rb", block_size=self.profile.block_size, cache_type="readahead"
                    )
                except FileNotFoundError:
                    return None
        return VerifyingReader(
            stream,
            info,
            changed_since=self._change_detector(uri, info),
            translate_errors=lambda: self._errors(uri, "loading"),
        )

    def _change_detector(self, uri: str, opened: ObjectInfo) -> Callable[[], bool]:
        def changed() -> bool:
            try:
                now = self.info(uri)
            except Exception:
                return False
            return now is None or now.version != opened.version

        return changed

    def info(self, uri: str) -> ObjectInfo | None:
        if self.protocol == "s3":
            return self._s3_info(uri)
        with self._errors(uri, "inspecting"):
            try:
                details = self.fs.info(uri)
                metadata = self._metadata(uri, details)
            except FileNotFoundError:
                return None
        if details.get("type") == "directory":
            return None
        version = details.get("ETag") or details.get("generation") or details.get("etag")
        modified = details.get("LastModified") or details.get("updated") or details.get("last_modified")
        return ObjectInfo(
            uri=uri,
            size=int(details.get("size") or 0),
            metadata=metadata,
            version=str(version) if version is not None else None,
            modified=modified if not isinstance(modified, str) else None,
        )

    def _s3_info(self, uri: str) -> ObjectInfo | None:
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
        return _s3_object_info(uri, response)

    def _metadata(self, uri: str, details: Mapping[str, Any]) -> dict[str, str]:
        return _our_metadata(details.get("metadata") or {})

    def copy(self, src: str, dst: str) -> None:
        if not self.profile.server_side_copy:
            super().copy(src, dst)
            return
        with self._errors(dst, "copying"):
            self.fs.copy(src, dst)  # CopyObject / rewrite: atomic at dst, keeps the metadata

    def delete(self, uri: str) -> None:
        with self._errors(uri, "deleting"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(uri)

    def list_prefix(self, uri: str) -> list[str]:
        with self._errors(uri, "listing"):
            try:
                found = self.fs.find(uri.rstrip("/") + "/")
            except FileNotFoundError:
                return []
        return sorted(self.fs.unstrip_protocol(path) for path in found)

    def delete_prefix(self, uri: str) -> None:
        with self._errors(uri, "deleting"):
            found = self.fs.find(uri.rstrip("/") + "/")
            if found:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(found)  # batched: one request per 1000 objects on S3


def _bound_azure_client(fs: Any, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
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
    connection_string = getattr(fs, "connection_string", None)
    if connection_string:
        fs.service_client = BlobServiceClient.from_connection_string(connection_string, **bounds)
    elif getattr(fs, "account_url", None) and (
        getattr(fs, "credential", None) or getattr(fs, "account_key", None)
    ):
        fs.service_client = BlobServiceClient(
            fs.account_url, credential=fs.credential or fs.account_key, **bounds
        )
    # Anonymous or SAS-in-URL access keeps adlfs's own client (and the SDK's retry policy).


def backend_protocol(uri: str) -> str:
    """The fsspec protocol for ``uri``."""
    return canonical_protocol(uri)
