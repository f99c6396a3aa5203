"""Google Cloud Storage through gcsfs: parallel part uploads composed into the object, parallel
ranged loads pinned to one generation. The backend first, then its adapter for
:mod:`~flyte_checkpoint.storage.parallel` (:class:`GCSObject`), on gcsfs's session.

Requests use gcsfs's aiohttp session, credentials, endpoint and ``requests_timeout`` on its
event loop, but not ``GCSFileSystem._call``: gcsfs retries each request up to 6 times with up
to 32 s of back-off, on top of the per-part budget :mod:`~flyte_checkpoint.storage.parallel` keeps (see
:mod:`~flyte_checkpoint.storage.retry`). Errors are raised as gcsfs raises them
(``validate_response``), so they translate as every other gcsfs error does.

Uploads. GCS's JSON API (and fake-gcs-server, the emulator the tests use, which has no XML
multipart API) has no multipart upload, and a resumable upload is sequential by protocol. So
each part is uploaded as a temporary object of its own, up to ``max_concurrency`` at once, and
Compose joins them into the destination, at most 32 sources per request: more parts are
composed in rounds into temporary intermediates first. The last compose creates the
destination atomically, with the metadata (digest and size included); until then the
destination keeps its previous object. Sources are named with the generation each upload
returned, so a compose can only use the bytes this save sent. An object smaller than one part
is one multipart (metadata + media) upload.

Temporary objects live under a hidden prefix beside the destination,
``<destination>.fc-parts/<upload id>/``, which :meth:`GCSBackend.list_prefix` leaves out
of listings. They are deleted when the save completes and when it fails; those a killed save
left behind are deleted by the next large save to the same destination once older than
``stale_upload_age`` (:meth:`GCSObject.sweep_stale`), an age read on the store's clock, and
those at an earlier attempt's checkpoint when the next attempt starts
(:meth:`GCSObject.discard_unfinished`, see
:func:`flyte_checkpoint.single.earlier_attempts.discard_earlier_uploads`).
Starting an upload sends no request, so unlike S3 no upload can exist whose id did not come back.

Loads. The object's metadata first (size, generation, our metadata), then ranged media GETs
pinned with ``generation=``: once the object has been replaced that generation is gone (404),
and the load fails with :class:`ObjectReplacedError` instead of mixing two versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import os
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar, cast
from urllib.parse import quote

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.storage.base import ObjectInfo, modified_time
from flyte_checkpoint.storage.parallel.bodies import PartBody
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError, RangeBody
from flyte_checkpoint.storage.stores.fsspec_store import (
    FsspecBackend,
    StoreObject,
    StoreProfile,
    our_metadata,
)

PROFILE = StoreProfile(
    implementation="gcsfs:GCSFileSystem",
    extra="gcs",
    # The compose that publishes the object sets its metadata, digest included.
    metadata_at_commit=True,
    server_side_copy=True,
    defaults={"requests_timeout": 300},
)

_GCSFS_TOKEN_WORDS = frozenset({"google_default", "cache", "anon", "browser", "cloud"})


def check_gcs_token(options: Mapping[str, Any]) -> None:
    """Refuse a ``token`` naming a file that does not exist: gcsfs then falls back to Google's
    token endpoint and fails with a ``requests.ConnectionError`` (or, online, a confusing 401)."""
    token = options.get("token")
    if not isinstance(token, str | os.PathLike) or str(token) in _GCSFS_TOKEN_WORDS:
        return
    path = os.fspath(token)
    if not os.path.exists(path):
        raise ConfigurationError(
            f"storage option 'token' names {path!r}, which does not exist; give the path of a "
            "service-account JSON file, a dict of its contents, or one of "
            f"{', '.join(sorted(_GCSFS_TOKEN_WORDS))} (or leave it out to use "
            "GOOGLE_APPLICATION_CREDENTIALS)"
        )


class GCSBackend(FsspecBackend):
    """GCS: saves and loads in parallel parts; a save's temporary part objects are never listed."""

    protocol = "gs"
    profile = PROFILE
    keeps_unfinished_uploads = True

    def _check_options(self, options: Mapping[str, Any]) -> None:
        check_gcs_token(options)

    def parallel_object(self, uri: str) -> StoreObject:
        return GCSObject(self.fs, uri)

    def list_prefix(self, uri: str) -> list[str]:
        return [listed for listed in super().list_prefix(uri) if not is_temporary(listed)]


# -- the parallel adapter ---------------------------------------------------------------------

logger = logging.getLogger("flyte_checkpoint")
T = TypeVar("T")

PARTS_SUFFIX = ".fc-parts"
"""Temporary part objects of a save to ``<destination>`` live below ``<destination>.fc-parts/``."""
MAX_PARTS = 10_000
COMPOSE_SOURCES = 32
"""GCS composes at most 32 source objects per request."""
REQUESTS_IN_FLIGHT = 8
"""Composes or deletes of one save sent at once (each may open a connection)."""
ABORT_WAIT = 10.0
"""Seconds an abort waits for part uploads still in flight before it deletes the parts."""
_CONTENT_TYPE = "application/octet-stream"
_BOUNDARY = "fc-part-boundary-7f3a"


def _date_of(response: Any) -> datetime | None:
    """The latest time a response's ``Date`` header allows, if it has a valid one.

    The header gives whole seconds, rounded down: the moment it stands for may be up to a
    second later.
    """
    try:
        date = email.utils.parsedate_to_datetime(response.headers["Date"])
    except (KeyError, TypeError, ValueError):
        return None
    return (date if date.tzinfo is not None else date.replace(tzinfo=timezone.utc)) + timedelta(seconds=1)


def is_temporary(name: str) -> bool:
    """Whether ``name`` (a URI or key) is one of the temporary objects of a save in progress."""
    return f"{PARTS_SUFFIX}/" in name


class _Response:
    """A media GET being received, as a :class:`RangeBody`."""

    def __init__(self, response: Any) -> None:
        self._response = response

    async def readinto(self, b: memoryview, /) -> int:
        chunk = await self._response.content.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)

    async def aclose(self) -> None:
        self._response.close()


class GCSObject:
    """One GCS object, as :class:`~flyte_checkpoint.storage.parallel.writer.ParallelWriter` uploads it and
    :class:`~flyte_checkpoint.storage.parallel.reader.ParallelReader` reads it."""

    def __init__(self, fs: Any, uri: str) -> None:
        self._fs = fs
        self.uri = uri
        self._bucket, self._key, generation = fs.split_path(uri)
        self._generation = str(generation) if generation else None
        self.max_parts = MAX_PARTS
        self.lost_creates = 0
        """Always 0: starting an upload sends no request (see :meth:`create`)."""
        self._crc32c: str | None = None
        """The whole object's CRC32C as its description gave it: each range is checked against it."""
        self._part_requests: set[asyncio.Task[str]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return cast(asyncio.AbstractEventLoop, self._fs.loop)

    # requests

    def _url(self, kind: str, name: str | None = None) -> str:
        """A JSON API URL: ``kind`` ``"o"`` (metadata), ``"upload"`` or ``"download"``."""
        location, bucket = self._fs._location, quote(self._bucket, safe="")
        if kind == "upload":
            return f"{location}/upload/storage/v1/b/{bucket}/o"
        prefix = f"{location}/download" if kind == "download" else location
        url = f"{prefix}/storage/v1/b/{bucket}/o"
        return url if name is None else f"{url}/{quote(name, safe='')}"

    async def _open(
        self,
        method: str,
        url: str,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: Any = None,
    ) -> Any:
        """Send one request (no retries of gcsfs's own); raise gcsfs's error for a failure status."""
        from gcsfs.retry import validate_response

        fs = self._fs
        await fs._set_session()
        response = await fs.session.request(
            method,
            url,
            params=fs._get_params(dict(params or {})),
            headers=fs._get_headers(dict(headers or {})),
            data=data,
            timeout=fs.requests_timeout,
        )
        if response.status >= 400:
            try:
                contents = await response.read()
            finally:
                response.close()
            validate_response(response.status, contents, url)
        return response

    async def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        parsed, _ = await self._json_dated(method, url, **kwargs)
        return parsed

    async def _json_dated(self, method: str, url: str, **kwargs: Any) -> tuple[Any, datetime | None]:
        """The response's JSON body, and the store's clock when it answered (:func:`_date_of`)."""
        response = await self._open(method, url, **kwargs)
        try:
            body = await response.read()
        finally:
            response.close()
        return (json.loads(body) if body else None), _date_of(response)

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await self._json("DELETE", self._url("o", name))

    async def _list(self, prefix: str) -> tuple[list[dict[str, Any]], datetime | None]:
        """The objects under ``prefix`` (name and creation time), and the store's clock when it
        answered (the ``Date`` of its first response; ``None`` if it sent none)."""
        found: list[dict[str, Any]] = []
        store_now: datetime | None = None
        params = {"prefix": prefix, "fields": "items(name,timeCreated),nextPageToken"}
        while True:
            try:
                page, date = await self._json_dated("GET", self._url("o"), params=params)
            except FileNotFoundError:
                return found, store_now
            store_now = store_now or date
            found += page.get("items", [])
            if not page.get("nextPageToken"):
                return found, store_now
            params = {**params, "pageToken": page["nextPageToken"]}

    # uploads

    def _parts_prefix(self, upload_id: str | None = None) -> str:
        base = f"{self._key}{PARTS_SUFFIX}/"
        return base if upload_id is None else f"{base}{upload_id}/"

    async def _upload(self, name: str, body: Any, metadata: Mapping[str, str] | None = None) -> str:
        """Upload ``body`` as the object ``name`` in one request; return its generation."""
        if metadata is None:
            params = {"uploadType": "media", "name": name}
            # Given, so aiohttp sends the file-like body with a length rather than chunked.
            headers = {"Content-Type": _CONTENT_TYPE, "Content-Length": str(len(body))}
        else:
            described = json.dumps({"name": name, "metadata": dict(metadata), "contentType": _CONTENT_TYPE})
            body = (
                (
                    f"--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{described}\r\n"
                    f"--{_BOUNDARY}\r\nContent-Type: {_CONTENT_TYPE}\r\n\r\n"
                ).encode()
                + bytes(body)
                + f"\r\n--{_BOUNDARY}--".encode()
            )
            params = {"uploadType": "multipart"}
            headers = {"Content-Type": f'multipart/related; boundary="{_BOUNDARY}"'}
        created = await self._json("POST", self._url("upload"), params=params, headers=headers, data=body)
        return str(created["generation"])

    async def put(self, body: memoryview, metadata: Mapping[str, str]) -> None:
        # One upload publishes the object atomically; the copy is of less than one part.
        await self._upload(self._key, body, metadata)

    async def create(self, metadata: Mapping[str, str]) -> str:
        # Nothing to start on the server: parts are objects named after the upload.
        return uuid.uuid4().hex

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        # A file-like body goes out in chunks, not as a copy of the part (see PartBody).
        request = asyncio.ensure_future(self._upload(f"{self._parts_prefix(upload_id)}{number:05d}", body))
        self._part_requests.add(request)
        request.add_done_callback(self._part_request_done)
        # Shielded: a part whose request is cancelled (an abort) may still be stored by the
        # server once its body is in; abort() lets such requests end before it lists the parts.
        return await asyncio.shield(request)

    def _part_request_done(self, request: asyncio.Task[str]) -> None:
        self._part_requests.discard(request)
        if not request.cancelled():
            request.exception()  # seen here when the part's caller was cancelled and is gone

    async def _compose(self, destination: str, sources: Sequence[tuple[str, str]], metadata: Any) -> str:
        composed = await self._json(
            "POST",
            f"{self._url('o', destination)}/compose",
            headers={"Content-Type": "application/json"},
            data=json.dumps(
                {
                    "sourceObjects": [{"name": name, "generation": gen} for name, gen in sources],
                    "destination": {"contentType": _CONTENT_TYPE, "metadata": metadata},
                }
            ),
        )
        return str(composed["generation"])

    async def complete(
        self, upload_id: str, receipts: Sequence[tuple[int, str]], metadata: Mapping[str, str]
    ) -> None:
        prefix = self._parts_prefix(upload_id)
        sources = [(f"{prefix}{number:05d}", generation) for number, generation in receipts]
        temporary = [name for name, _ in sources]
        rounds = 0
        while len(sources) > COMPOSE_SOURCES:
            # More than one request can take: compose groups into intermediates first (named
            # per round, so a retried completion overwrites them; an abort deletes them).
            rounds += 1
            groups = [sources[i : i + COMPOSE_SOURCES] for i in range(0, len(sources), COMPOSE_SOURCES)]
            names = [f"{prefix}c{rounds}-{index:05d}" for index in range(len(groups))]
            temporary += names
            composes = (self._compose(name, group, None) for name, group in zip(names, groups, strict=True))
            sources = list(zip(names, await _bounded(composes), strict=True))
        # The one atomic step: the destination becomes the parts, in order, with the metadata.
        await self._compose(self._key, sources, dict(metadata))
        try:
            await self._delete_all(temporary)
        except Exception as exc:
            # The save has landed; what is left is swept by a later save (stale_upload_age).
            logger.warning("could not delete the temporary parts of %s: %r", self.uri, exc)

    async def _delete_all(self, names: Sequence[str]) -> None:
        await _bounded(self._delete(name) for name in names)

    async def abort(self, upload_id: str) -> None:
        if self._part_requests:
            # Bounded: a stalled request is cut off; the stale sweep deletes what it may leave.
            await asyncio.wait(set(self._part_requests), timeout=ABORT_WAIT)
            for request in self._part_requests:
                request.cancel()
        # Listed, not remembered: a part whose response was lost exists all the same.
        parts, _ = await self._list(self._parts_prefix(upload_id))
        await self._delete_all([item["name"] for item in parts])

    async def unfinished(self) -> list[str]:
        # An upload is only a name this process chose (create() asks the server nothing), so no
        # answer can be lost: there is never an upload of this save whose id is unknown.
        return []

    async def holds_parts(self, upload_id: str) -> bool:
        parts, _ = await self._list(self._parts_prefix(upload_id))
        return bool(parts)

    async def discard_unfinished(self) -> int:
        """Delete every save's temporary objects of this destination; the count of saves."""
        base = self._parts_prefix()
        items, _ = await self._list(base)
        await self._delete_all([str(item["name"]) for item in items])
        return len({str(item["name"])[len(base) :].split("/", 1)[0] for item in items})

    async def sweep_stale(self, keep: str, older_than: float) -> int:
        """Delete the temporary objects that killed saves to this object left (not ``keep``'s).

        Ages are read on the store's clock (the listing's ``Date``), against the creation times
        the store gave the parts, so a client whose clock runs ahead cannot make another save's
        running parts look stale. The client's clock is used only if the store sends no date.
        """
        base = self._parts_prefix()
        items, store_now = await self._list(base)
        # The Date's rounding up (``_date_of``) can make a part look up to a second older: far
        # below any useful stale_upload_age, and it lets an age of 0 mean "every leftover".
        cutoff = (store_now or datetime.now(timezone.utc)) - timedelta(seconds=older_than)
        uploads: dict[str, list[str]] = {}
        fresh: set[str] = set()
        for item in items:
            upload_id = str(item["name"])[len(base) :].split("/", 1)[0]
            if upload_id == keep:
                continue
            created = modified_time(item.get("timeCreated"))
            uploads.setdefault(upload_id, []).append(str(item["name"]))
            if created is None or created > cutoff:
                fresh.add(upload_id)  # a save that may still be running
        stale = {upload_id: names for upload_id, names in uploads.items() if upload_id not in fresh}
        await self._delete_all([name for names in stale.values() for name in names])
        return len(stale)

    # downloads

    def _pinned(self, generation: str | None) -> dict[str, str]:
        generation = generation or self._generation
        return {"alt": "media", **({"generation": generation} if generation else {})}

    async def _get_range(self, start: int, length: int, generation: str | None) -> RangeBody:
        response = await self._open(
            "GET",
            self._url("download", self._key),
            params=self._pinned(generation),
            headers={"Range": f"bytes={start}-{start + length - 1}"},
        )
        # GCS answers a replaced generation with 404; fake-gcs-server keeps the generation when a
        # compose replaces an object, so the whole object's CRC32C (sent with every range) is
        # compared too.
        hashes = dict(
            item.strip().partition("=")[::2] for item in response.headers.get("X-Goog-Hash", "").split(",")
        )
        if self._crc32c and hashes.get("crc32c", self._crc32c) != self._crc32c:
            response.close()
            raise FileNotFoundError(f"{self.uri} at generation {generation}")
        if response.status != 206 and start > 0:
            response.close()
            raise ValueError(
                f"the server holding {self.uri} ignored a ranged GET; parallel loads need Range "
                "support (GCS and its emulators have it)"
            )
        return _Response(response)

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        params = {"generation": self._generation} if self._generation else {}
        try:
            described = await self._json("GET", self._url("o", self._key), params=params)
        except FileNotFoundError:
            return None
        info = ObjectInfo(
            uri=self.uri,
            size=int(described.get("size") or 0),
            metadata=our_metadata(described.get("metadata") or {}),
            version=str(described["generation"]),
            modified=modified_time(described.get("updated")),
        )
        self._crc32c = described.get("crc32c")
        if info.size == 0:
            return info, _Empty()
        return info, await self.get_range(0, min(length, info.size), info.version)

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        try:
            return await self._get_range(start, length, version)
        except FileNotFoundError as exc:
            raise ObjectReplacedError(
                f"checkpoint {self.uri} was replaced while it was being read; load it again to "
                "read the new version"
            ) from exc


async def _bounded(requests: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """The results of ``requests``, at most :data:`REQUESTS_IN_FLIGHT` of them running at once."""
    limit = asyncio.Semaphore(REQUESTS_IN_FLIGHT)

    async def one(request: Coroutine[Any, Any, T]) -> T:
        async with limit:
            return await request

    return list(await asyncio.gather(*(one(request) for request in requests)))


class _Empty:
    """The body of an empty object: nothing to ask the server for."""

    async def readinto(self, b: memoryview, /) -> int:
        return 0

    async def aclose(self) -> None:
        pass
