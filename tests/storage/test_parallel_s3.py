"""Parallel S3 uploads and ranged loads against moto: atomic, ordered, pinned, bounded."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fsspec.asyn import sync

from flyte_checkpoint.errors import (
    CheckpointPermissionError,
    CheckpointTimeoutError,
    CheckpointUnavailableError,
    InputChangedError,
    describe_error,
)
from flyte_checkpoint.progress import ProgressReporter
from flyte_checkpoint.single import transfer
from flyte_checkpoint.storage.base import DIGEST_KEY, FORMAT_KEY, ObjectInfo, VerifyingReader
from flyte_checkpoint.storage.digests import digest_of
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.bodies import FilePartBody, MemoryPartBody, PartBody
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError, RangeBody
from flyte_checkpoint.storage.parallel.reader import ParallelReader
from flyte_checkpoint.storage.parallel.retries import mark_retried_by_client
from flyte_checkpoint.storage.parallel.sizing import first_range_size, range_size_for, transfer_memory
from flyte_checkpoint.storage.parallel.writer import ParallelWriter
from flyte_checkpoint.storage.stores.s3 import S3Backend, S3Object
from tests.faults.proxy import FaultProxy, drop_before_response
from tests.storage.parallel_faults import FaultyTarget, Wrapped
from tests.storage.s3_direct import open_s3_reader, open_s3_writer
from tests.storage_servers import StorageServer, create_bucket

PART = 5 << 20  # S3's smallest part: moto re-reads a whole object per ranged GET, so keep them few
SETTINGS = TransferSettings(part_size=PART, max_concurrency=3, part_attempts=3)
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Bucket:
    name: str
    fs: Any
    server: StorageServer

    def uri(self, key: str) -> str:
        return f"s3://{self.name}/{key}"

    def call(self, operation: str, **params: Any) -> Any:
        return sync(self.fs.loop, self.fs._call_s3, operation, Bucket=self.name, **params)

    def uploads(self, key: str) -> list[str]:
        page = self.call("list_multipart_uploads", Prefix=key)
        return [upload["UploadId"] for upload in page.get("Uploads", []) if upload["Key"] == key]


@pytest.fixture
def bucket(s3_server: StorageServer) -> Bucket:
    return new_bucket(s3_server, "par")


def new_bucket(s3_server: StorageServer, prefix: str, **options: Any) -> Bucket:
    """A fresh bucket, seen through an ``S3Backend`` built with these storage options."""
    backend = S3Backend({**s3_server.storage_options, **options})
    return Bucket(create_bucket(s3_server, prefix), backend.fs, s3_server)


def save(bucket: Bucket, key: str, data: bytes, *, declared: bool = True, chunk: int = 1 << 20) -> None:
    writer = open_s3_writer(
        bucket.fs,
        bucket.uri(key),
        {FORMAT_KEY: "payload"},
        SETTINGS,
        declared_digest=digest_of(data) if declared else None,
        declared_size=len(data) if declared else None,
    )
    with writer:
        for start in range(0, len(data), chunk):
            writer.write(data[start : start + chunk])


def load(reader: ParallelReader | None, chunk: int = 300_000) -> tuple[bytes, VerifyingReader]:
    assert reader is not None
    verifying = VerifyingReader(reader, reader.info)  # type: ignore[arg-type]
    out = bytearray()
    buffer = bytearray(chunk)
    with verifying:
        while count := verifying.readinto(buffer):
            out += buffer[:count]
    return bytes(out), verifying


def later_range_starts(size: int, settings: TransferSettings = SETTINGS) -> list[int]:
    """Where the ranges after the first GET start, for an object of ``size`` bytes."""
    first = first_range_size(settings)
    return list(range(first, size, range_size_for(settings, size, first)))


def stored(bucket: Bucket, key: str) -> bytes:
    return bytes(bucket.fs.cat_file(bucket.uri(key)))


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 3 * PART + 12345])
def test_an_object_of_any_size_round_trips_with_its_digest_verified(bucket: Bucket, size: int) -> None:
    data = os.urandom(size)
    save(bucket, "obj", data)
    got, verifying = load(open_s3_reader(bucket.fs, bucket.uri("obj"), SETTINGS))
    assert got == data
    assert verifying.verified
    assert verifying.info.recorded_digest == digest_of(data)
    assert verifying.info.size == size


def test_an_upload_of_unknown_length_round_trips_in_parts(bucket: Bucket) -> None:
    data = os.urandom(2 * PART + 1)
    save(bucket, "stream", data, declared=False, chunk=65_536)
    got, verifying = load(open_s3_reader(bucket.fs, bucket.uri("stream"), SETTINGS), chunk=1 << 20)
    assert got == data
    assert verifying.verified


def test_an_object_smaller_than_a_part_is_one_put_that_records_its_digest(bucket: Bucket) -> None:
    data = b"x" * 1000
    with recorded_requests(bucket) as sent:
        save(bucket, "small", data, declared=False)
    assert [request.operation for request in sent] == ["PutObject"]
    reader = open_s3_reader(bucket.fs, bucket.uri("small"), SETTINGS)
    assert reader is not None
    reader.close()
    assert reader.info.recorded_digest == digest_of(data)


def test_a_missing_object_opens_as_none(bucket: Bucket) -> None:
    assert open_s3_reader(bucket.fs, bucket.uri("never-written"), SETTINGS) is None


# -- requests on the wire ----------------------------------------------------------------------


@dataclass
class SentRequest:
    operation: str
    headers: Mapping[str, str]


@contextlib.contextmanager
def recorded_requests(bucket: Bucket) -> Iterator[list[SentRequest]]:
    """Every request the client sends, with the headers it goes out with."""
    sent: list[SentRequest] = []

    def record(request: Any, event_name: str, **kwargs: Any) -> None:
        headers = {
            name: value.decode() if isinstance(value, bytes) else value
            for name, value in request.headers.items()
        }
        sent.append(SentRequest(event_name.rsplit(".", 1)[-1], headers))

    sync(bucket.fs.loop, bucket.fs.set_session)
    client = sync(bucket.fs.loop, bucket.fs.get_s3, bucket.name)
    client.meta.events.register("before-send.s3", record)
    try:
        yield sent
    finally:
        client.meta.events.unregister("before-send.s3", record)


def the_put(sent: list[SentRequest]) -> Mapping[str, str]:
    """The headers of the one PutObject among ``sent``."""
    (put,) = [request.headers for request in sent if request.operation == "PutObject"]
    return put


def test_uploads_send_no_expect_100_continue(bucket: Bucket) -> None:
    with recorded_requests(bucket) as sent:
        save(bucket, "big", os.urandom(PART + 1))
        save(bucket, "small", b"small")
    uploads = [request for request in sent if request.operation in ("PutObject", "UploadPart")]
    assert [request.operation for request in uploads] == ["UploadPart", "UploadPart", "PutObject"]
    assert all("Expect" not in request.headers for request in uploads)


def test_a_body_damaged_after_its_digest_goes_out_with_the_recorded_crc32(bucket: Bucket) -> None:
    # S3 refuses a body that does not match the checksum sent with it (BadDigest), so the
    # damaged save fails and the previous object stays; moto does not check, so this test
    # checks what is sent: the CRC32 the object records, not one taken of the damaged body.
    data = b"checked by the store"
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("damaged")), damage_put=True)
    with recorded_requests(bucket) as sent:
        faulty_save(target, data)
    crc = zlib.crc32(data).to_bytes(4, "big")
    assert the_put(sent)["x-amz-checksum-crc32"] == base64.b64encode(crc).decode()
    assert bucket.call("head_object", Key="damaged")["Metadata"][DIGEST_KEY] == f"crc32:{crc.hex()}"


def test_a_checksum_chosen_in_s3_additional_kwargs_is_the_one_sent(s3_server: StorageServer) -> None:
    chosen = new_bucket(s3_server, "sha", s3_additional_kwargs={"ChecksumAlgorithm": "SHA256"})
    with recorded_requests(chosen) as sent:
        save(chosen, "chosen", b"the user's choice")
    put = the_put(sent)
    assert "x-amz-checksum-sha256" in put
    assert "x-amz-checksum-crc32" not in put


def test_checksums_turned_off_in_botocores_config_stay_off(s3_server: StorageServer) -> None:
    # The setting users need for S3-compatible stores that refuse x-amz-checksum-* headers.
    plain = new_bucket(s3_server, "plain", config_kwargs={"request_checksum_calculation": "when_required"})
    with recorded_requests(plain) as sent:
        save(plain, "plain", b"no checksum header")
    assert not [name for name in the_put(sent) if name.lower().startswith("x-amz-checksum")]


def test_ranges_after_the_first_are_pinned_to_its_etag(bucket: Bucket) -> None:
    size = 2 * PART + 1
    save(bucket, "pinned", os.urandom(size))
    with recorded_requests(bucket) as sent:
        reader = open_s3_reader(bucket.fs, bucket.uri("pinned"), SETTINGS)
        assert reader is not None
        load(reader)
    gets = [request.headers for request in sent if request.operation == "GetObject"]
    later = later_range_starts(size)
    assert len(later) == 3  # the first MiB, then the rest in one equal share per connection
    assert len(gets) == 1 + len(later)
    assert "If-Match" not in gets[0]
    assert [headers["If-Match"] for headers in gets[1:]] == [reader.info.version] * len(later)


# -- faults -------------------------------------------------------------------------------------


def faulty_save(target: FaultyTarget, data: bytes, settings: TransferSettings = SETTINGS) -> None:
    with ParallelWriter(target, {FORMAT_KEY: "payload"}, settings) as writer:
        for start in range(0, len(data), 1 << 20):
            writer.write(data[start : start + (1 << 20)])


def test_a_failed_part_aborts_the_upload_and_keeps_the_old_object(bucket: Bucket) -> None:
    save(bucket, "obj", b"old checkpoint")
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), fail_part=2)
    with pytest.raises(CheckpointPermissionError):
        faulty_save(target, os.urandom(4 * PART))
    assert stored(bucket, "obj") == b"old checkpoint"
    assert bucket.uploads("obj") == []
    assert target.attempts[2] == 1  # refused access is not retried


def test_a_transient_part_failure_is_retried_on_its_own(bucket: Bucket) -> None:
    error = ConnectionResetError("injected reset")
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), fail_part=2, error=error, times=1)
    data = os.urandom(3 * PART)
    faulty_save(target, data)
    assert stored(bucket, "obj") == data
    assert target.attempts == {1: 1, 2: 2, 3: 1}


def test_a_part_retried_after_its_body_was_sent_is_sent_again_from_its_start(bucket: Bucket) -> None:
    error = ConnectionResetError("injected: the reply was lost")
    target = FaultyTarget(
        S3Object(bucket.fs, bucket.uri("obj")), fail_part=2, error=error, times=1, fail_after_sending=True
    )
    data = os.urandom(3 * PART)
    faulty_save(target, data, SETTINGS.model_copy(update={"transfer_timeout": 30.0}))
    assert stored(bucket, "obj") == data
    assert target.attempts == {1: 1, 2: 2, 3: 1}


def test_parts_that_finish_out_of_order_are_completed_in_order(bucket: Bucket) -> None:
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), hold_part_until_done=(1, 3))
    data = os.urandom(3 * PART + 1)
    faulty_save(target, data)
    assert target.finished.index(3) < target.finished.index(1)
    assert stored(bucket, "obj") == data


def test_an_interrupt_while_writing_aborts_the_upload(bucket: Bucket) -> None:
    save(bucket, "obj", b"old checkpoint")
    writer = open_s3_writer(bucket.fs, bucket.uri("obj"), {}, SETTINGS)

    def interrupted_save() -> None:
        with writer:
            writer.write(os.urandom(2 * PART + 1))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_save()
    assert stored(bucket, "obj") == b"old checkpoint"
    assert bucket.uploads("obj") == []


def test_an_upload_past_its_transfer_timeout_is_aborted(bucket: Bucket) -> None:
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), hold_part_until_done=(1, 99))
    settings = SETTINGS.model_copy(update={"transfer_timeout": 1.0})
    with pytest.raises(CheckpointTimeoutError, match="transfer_timeout"):
        faulty_save(target, os.urandom(2 * PART + 1), settings)
    assert bucket.uploads("obj") == []


def test_an_upload_whose_start_outlives_the_transfer_timeout_is_still_aborted(bucket: Bucket) -> None:
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), slow_create_response=2.0)
    settings = SETTINGS.model_copy(update={"transfer_timeout": 1.0})
    with pytest.raises(CheckpointTimeoutError, match="transfer_timeout"):
        faulty_save(target, os.urandom(2 * PART + 1), settings)
    assert bucket.uploads("obj") == []


def test_an_overwrite_during_a_load_fails_it_instead_of_mixing_versions(bucket: Bucket) -> None:
    save(bucket, "obj", b"a" * (3 * PART))
    one_at_a_time = SETTINGS.model_copy(update={"max_concurrency": 1})
    reader = open_s3_reader(bucket.fs, bucket.uri("obj"), one_at_a_time)
    save(bucket, "obj", b"b" * (3 * PART))
    with pytest.raises(ObjectReplacedError, match="replaced while it was being read"):
        load(reader)


@dataclass
class BreakingBody:
    """A response body that breaks off after ``allowed`` bytes, as a dropped connection does."""

    real: RangeBody
    allowed: int

    async def readinto(self, b: memoryview, /) -> int:
        if self.allowed <= 0:
            raise ConnectionResetError("injected: connection dropped mid-body")
        count = await self.real.readinto(b[: self.allowed])
        self.allowed -= count
        return count

    async def aclose(self) -> None:
        await self.real.aclose()


@dataclass
class BreakingSource(Wrapped):
    """The real S3 object, whose first response body breaks off after 1000 bytes."""

    ranges_asked: list[int] = field(default_factory=list)

    async def open(self, length: int) -> tuple[ObjectInfo, RangeBody] | None:
        opened = await self.real.open(length)
        assert opened is not None
        return opened[0], BreakingBody(opened[1], allowed=1000)

    async def get_range(self, start: int, length: int, version: str | None) -> RangeBody:
        self.ranges_asked.append(start)
        body: RangeBody = await self.real.get_range(start, length, version)
        return body


def test_a_range_cut_off_mid_body_resumes_where_it_stopped(bucket: Bucket) -> None:
    data = os.urandom(PART + 7)
    save(bucket, "obj", data)
    source = BreakingSource(S3Object(bucket.fs, bucket.uri("obj")))
    got, verifying = load(ParallelReader.open(source, SETTINGS))
    assert got == data
    assert verifying.verified
    assert sorted(source.ranges_asked) == [1000, *later_range_starts(len(data))]


# -- stale uploads ------------------------------------------------------------------------------


def leftover_upload(bucket: Bucket, key: str) -> str:
    """An upload a killed save left behind (started just before the save that sweeps).

    Ages are read on the store's clock, relative to the sweeping save's own upload. (moto
    reports one fixed start time, years ago, for every upload: there the leftover's age is 0.)
    """
    return str(bucket.call("create_multipart_upload", Key=key)["UploadId"])


def save_in_parts(bucket: Bucket, key: str, settings: TransferSettings) -> None:
    with open_s3_writer(bucket.fs, bucket.uri(key), {}, settings) as writer:
        writer.write(os.urandom(PART + 1))


def test_a_save_aborts_an_upload_older_than_the_stale_age(bucket: Bucket) -> None:
    leftover_upload(bucket, "obj")
    save_in_parts(bucket, "obj", SETTINGS.model_copy(update={"stale_upload_age": 0}))
    assert bucket.uploads("obj") == []


def test_a_save_leaves_an_upload_younger_than_the_stale_age_alone(bucket: Bucket) -> None:
    recent = leftover_upload(bucket, "obj")
    save_in_parts(bucket, "obj", SETTINGS.model_copy(update={"stale_upload_age": 3600}))
    assert bucket.uploads("obj") == [recent]
    bucket.call("abort_multipart_upload", Key="obj", UploadId=recent)


def test_upload_ages_are_read_on_the_stores_clock_not_the_clients(bucket: Bucket) -> None:
    # moto dates every upload years back: on the client's clock the other save's upload would
    # look stale and be aborted under it; on the store's clock it started with this one.
    running = leftover_upload(bucket, "obj")
    initiated = next(
        upload["Initiated"]
        for upload in bucket.call("list_multipart_uploads", Prefix="obj")["Uploads"]
        if upload["UploadId"] == running
    )
    assert (datetime.now(timezone.utc) - initiated).total_seconds() > 3600  # the client's view
    save_in_parts(bucket, "obj", SETTINGS.model_copy(update={"stale_upload_age": 3600}))
    assert bucket.uploads("obj") == [running]
    bucket.call("abort_multipart_upload", Key="obj", UploadId=running)


def test_a_save_leaves_uploads_to_other_keys_alone(bucket: Bucket) -> None:
    other = leftover_upload(bucket, "obj-other")
    save_in_parts(bucket, "obj", SETTINGS.model_copy(update={"stale_upload_age": 0}))
    assert bucket.uploads("obj-other") == [other]
    bucket.call("abort_multipart_upload", Key="obj-other", UploadId=other)


# -- uploads started by a request whose answer was lost ----------------------------------------
# A proxy drops the answer to CreateMultipartUpload after moto has started the upload: the id
# never reaches the client, and botocore's retry (max_attempts 3) starts another.

_CREATE = {"method": "POST", "path_contains": "?uploads"}


@pytest.fixture
def cut_bucket(s3_server: StorageServer) -> Iterator[tuple[Bucket, Bucket, FaultProxy]]:
    """One bucket seen directly and through a fault proxy: (direct, proxied, proxy)."""
    direct = new_bucket(s3_server, "cut")
    with FaultProxy(upstream=("127.0.0.1", s3_server.port)) as proxy:
        proxied = S3Backend(
            {
                **s3_server.storage_options,
                "endpoint_url": proxy.url,
                "config_kwargs": {"read_timeout": 5, "retries": {"max_attempts": 3, "mode": "standard"}},
                "skip_instance_cache": True,
            }
        )
        yield direct, Bucket(direct.name, proxied.fs, s3_server), proxy


def test_a_save_whose_upload_never_started_for_the_client_aborts_what_its_requests_started(
    cut_bucket: tuple[Bucket, Bucket, FaultProxy],
) -> None:
    direct, proxied, proxy = cut_bucket
    proxy.add_fault(drop_before_response(), times=None, **_CREATE)
    with pytest.raises(CheckpointUnavailableError):
        save(proxied, "obj", os.urandom(PART + 1))
    starts = [r for r in proxy.requests if r.method == "POST" and "?uploads" in r.path]
    assert len(starts) > 1
    assert all(r.upstream_status == 200 for r in starts)  # each started one
    assert direct.uploads("obj") == []


def test_a_save_whose_first_start_went_unanswered_lands_and_leaves_no_upload(
    cut_bucket: tuple[Bucket, Bucket, FaultProxy],
) -> None:
    direct, proxied, proxy = cut_bucket
    data = os.urandom(PART + 1)
    proxy.add_fault(drop_before_response(), times=1, **_CREATE)
    save(proxied, "obj", data)
    assert stored(direct, "obj") == data
    assert direct.uploads("obj") == []


def test_another_writers_upload_to_the_same_key_outlives_a_save_whose_start_went_unanswered(
    cut_bucket: tuple[Bucket, Bucket, FaultProxy],
) -> None:
    direct, proxied, proxy = cut_bucket
    running = leftover_upload(direct, "obj")  # started before this save: never one of its own
    proxy.add_fault(drop_before_response(), times=None, **_CREATE)
    with pytest.raises(CheckpointUnavailableError):
        save(proxied, "obj", os.urandom(PART + 1))
    assert direct.uploads("obj") == [running]
    direct.call("abort_multipart_upload", Key="obj", UploadId=running)


def test_an_upload_holding_parts_is_never_taken_for_one_whose_start_went_unanswered(
    cut_bucket: tuple[Bucket, Bucket, FaultProxy],
) -> None:
    # Another writer that starts while this save's start is unanswered, and has stored a part:
    # it knows its id, so it is not one of this save's.
    direct, proxied, proxy = cut_bucket
    proxy.add_fault(drop_before_response(), times=None, **_CREATE)
    target = AnotherWriterStarts(S3Object(proxied.fs, proxied.uri("obj")), direct=direct)
    with pytest.raises(CheckpointUnavailableError):
        faulty_save(target, os.urandom(PART + 1), SETTINGS)
    assert direct.uploads("obj") == target.others
    direct.call("abort_multipart_upload", Key="obj", UploadId=target.others[0])


@dataclass
class AnotherWriterStarts(FaultyTarget):
    """Before this save's first request to start its upload, another writer starts one to the
    same key and stores a part in it."""

    direct: Bucket | None = None
    others: list[str] = field(default_factory=list)

    def _another_writer_starts(self) -> None:
        assert self.direct is not None
        self.others.append(leftover_upload(self.direct, "obj"))
        self.direct.call("upload_part", Key="obj", UploadId=self.others[0], PartNumber=1, Body=b"part")

    async def create(self, metadata: Mapping[str, str]) -> str:
        if not self.others:
            await asyncio.to_thread(self._another_writer_starts)
        return await super().create(metadata)


# -- settings -----------------------------------------------------------------------------------


def test_settings_come_from_storage_options_and_leave_the_rest() -> None:
    options = {"part_size": 16 << 20, "max_concurrency": 4, "endpoint_url": "http://x"}
    settings, rest = TransferSettings.from_storage_options(options)
    assert (settings.part_size, settings.max_concurrency) == (16 << 20, 4)
    assert rest == {"max_concurrency": 4, "endpoint_url": "http://x"}
    assert transfer_memory(settings) == 5 * (16 << 20)


def test_a_nonsensical_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        TransferSettings.from_storage_options({"max_concurrency": 0})


# -- memory -------------------------------------------------------------------------------------

_MEASURE = """
import json, resource, sys
from flyte_checkpoint.storage.base import VerifyingReader
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.stores.s3 import S3Backend
from tests.storage.s3_direct import open_s3_reader, open_s3_writer

options, uri, path, settings = json.loads(sys.argv[1])
settings = TransferSettings(**settings)
fs = S3Backend(options).fs

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def save(target, source):
    with open(source, "rb") as handle, open_s3_writer(fs, target, {}, settings) as writer:
        writer.write_from(handle)

def load(target):
    reader = open_s3_reader(fs, target, settings)
    with VerifyingReader(reader, reader.info) as verifying:
        buffer = bytearray(1 << 20)
        while verifying.readinto(buffer):
            pass

with open(path + ".small", "wb") as handle:
    handle.write(b"warm-up")
save(uri + ".small", path + ".small")
load(uri + ".small")
before = peak()
save(uri, path)
after_save = peak()
load(uri)
print(json.dumps({"before": before, "save": after_save, "load": peak()}))
"""


def test_a_large_save_and_load_stay_within_the_documented_memory(bucket: Bucket, tmp_path: Path) -> None:
    settings = TransferSettings(part_size=PART, max_concurrency=4)
    size = 96 << 20  # larger than the buffers and the margin together: a whole copy would show
    source = tmp_path / "big"
    with open(source, "wb") as handle:
        for _ in range(size >> 20):
            handle.write(os.urandom(1 << 20))
    arguments = [bucket.server.storage_options, bucket.uri("big"), str(source), settings.model_dump()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps(arguments)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    peaks = json.loads(done.stdout)
    allowed = transfer_memory(settings) + (16 << 20)  # socket buffers, chunks, allocator slack
    assert peaks["save"] - peaks["before"] < allowed
    assert peaks["load"] - peaks["before"] < allowed


def test_a_part_request_the_client_already_retried_is_not_tried_again_by_the_part_layer(
    bucket: Bucket,
) -> None:
    error = ConnectionResetError("reset after botocore's own attempts")
    mark_retried_by_client(error)
    target = FaultyTarget(S3Object(bucket.fs, bucket.uri("obj")), fail_part=2, error=error, times=1)
    with pytest.raises(CheckpointUnavailableError):
        faulty_save(target, os.urandom(3 * PART))
    assert target.attempts[2] == 1  # the budget of one request stays REQUEST_ATTEMPTS (retry.py)


class HeldStart(S3Object):
    """An S3 key whose multipart upload starts only once ``released`` is set."""

    def __init__(self, fs: Any, uri: str, released: threading.Event) -> None:
        super().__init__(fs, uri)
        self.released = released

    async def create(self, metadata: Mapping[str, str]) -> str:
        while not self.released.is_set():  # noqa: ASYNC110 - set by the test's thread
            await asyncio.sleep(0.01)
        return await super().create(metadata)


def test_parts_queued_before_a_pause_wait_for_the_gate(bucket: Bucket) -> None:
    gate, released = threading.Event(), threading.Event()
    gate.set()
    writer = ParallelWriter(HeldStart(bucket.fs, bucket.uri("obj"), released), {}, SETTINGS, gate=gate)
    data = os.urandom(2 * PART + 1)
    with recorded_requests(bucket) as sent:
        writer.write(data)  # parts 1 and 2 are queued behind the start of the upload
        gate.clear()  # a background save pauses (the caller takes a snapshot)
        released.set()
        time.sleep(0.5)
        held = [request.operation for request in sent]
        gate.set()
        writer.commit()
    assert "CreateMultipartUpload" in held
    assert "UploadPart" not in held
    assert stored(bucket, "obj") == data


# -- a regular file, sent straight from the file ------------------------------------------------


@dataclass
class FileFaults(FaultyTarget):
    """The real target, recording each part's body and how many were in flight at once."""

    bodies: list[PartBody] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    async def upload_part(self, upload_id: str, number: int, body: PartBody) -> str:
        self.bodies.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # so that parts overlap
            return await super().upload_part(upload_id, number, body)
        finally:
            self.in_flight -= 1


def file_save(target: FaultyTarget, path: Path, settings: TransferSettings = SETTINGS, **kwargs: Any) -> None:
    with (
        open(path, "rb") as source,
        ParallelWriter(target, {FORMAT_KEY: "payload"}, settings, **kwargs) as writer,
    ):
        writer.write_from(source)


def random_file(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(size))
    return path


def test_a_file_save_records_the_digest_of_the_bytes_its_parts_sent(bucket: Bucket, tmp_path: Path) -> None:
    path = random_file(tmp_path, 2 * PART + 1)

    def rewrite() -> None:
        with open(path, "r+b") as handle:
            handle.seek(PART)
            handle.write(b"new bytes")

    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")), before_part={2: rewrite})
    writer = ParallelWriter(target, {}, SETTINGS)  # nothing declared up front, as on Azure
    with open(path, "rb") as source:
        writer.write_from(source)
    info = writer.commit()
    assert stored(bucket, "obj") == path.read_bytes()
    assert info.metadata[DIGEST_KEY] == digest_of(path.read_bytes())


def test_a_file_larger_than_a_part_is_sent_from_the_file_without_part_buffers(
    bucket: Bucket, tmp_path: Path
) -> None:
    path = random_file(tmp_path, 3 * PART + 12345)
    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")))
    file_save(target, path)
    assert [type(body) for body in target.bodies] == [FilePartBody] * 4
    got, verifying = load(open_s3_reader(bucket.fs, bucket.uri("obj"), SETTINGS))
    assert got == path.read_bytes()
    assert verifying.verified


def test_buffered_parts_in_flight_are_bounded_by_max_concurrency(bucket: Bucket) -> None:
    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")))
    data = os.urandom(5 * PART)
    faulty_save(target, data, SETTINGS.model_copy(update={"max_concurrency": 1}))
    assert target.most_in_flight == 1  # the second buffer is filled meanwhile, not sent
    assert stored(bucket, "obj") == data


def test_file_parts_in_flight_are_bounded_by_file_concurrency(bucket: Bucket, tmp_path: Path) -> None:
    path = random_file(tmp_path, 6 * PART)
    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")))
    file_save(target, path, SETTINGS.model_copy(update={"file_concurrency": 2, "max_concurrency": 1}))
    assert target.most_in_flight == 2
    assert stored(bucket, "obj") == path.read_bytes()


def test_a_file_rewritten_during_its_upload_fails_the_save_and_keeps_the_old_object(
    bucket: Bucket, tmp_path: Path
) -> None:
    save(bucket, "obj", b"old checkpoint")
    path = random_file(tmp_path, 3 * PART)

    def rewrite() -> None:
        with open(path, "r+b") as handle:
            handle.seek(PART + 100)
            handle.write(b"rewritten")

    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")), before_part={2: rewrite})
    data = path.read_bytes()
    writer = ParallelWriter.opened(
        target, {}, SETTINGS, metadata_at_start=True, declared_digest=digest_of(data), declared_size=len(data)
    )
    with open(path, "rb") as source:
        writer.write_from(source)
    with pytest.raises(InputChangedError, match="changed while it was being uploaded"):
        writer.commit()
    assert stored(bucket, "obj") == b"old checkpoint"
    assert bucket.uploads("obj") == []


def test_a_file_cut_short_during_its_upload_fails_the_save_and_keeps_the_old_object(
    bucket: Bucket, tmp_path: Path
) -> None:
    save(bucket, "obj", b"old checkpoint")
    path = random_file(tmp_path, 3 * PART)
    target = FileFaults(
        S3Object(bucket.fs, bucket.uri("obj")), before_part={3: lambda: os.truncate(path, PART)}
    )
    with pytest.raises(InputChangedError, match="got shorter"):
        file_save(target, path)
    assert stored(bucket, "obj") == b"old checkpoint"
    assert bucket.uploads("obj") == []


def test_a_file_part_retried_after_its_body_was_sent_is_sent_again_from_its_start(
    bucket: Bucket, tmp_path: Path
) -> None:
    path = random_file(tmp_path, 3 * PART)
    error = ConnectionResetError("injected: the reply was lost")
    target = FileFaults(
        S3Object(bucket.fs, bucket.uri("obj")), fail_part=2, error=error, times=1, fail_after_sending=True
    )
    file_save(target, path, SETTINGS.model_copy(update={"transfer_timeout": 30.0}))
    assert stored(bucket, "obj") == path.read_bytes()


def test_nothing_can_be_written_after_a_file_sent_from_the_file(bucket: Bucket, tmp_path: Path) -> None:
    path = random_file(tmp_path, 2 * PART)
    writer = ParallelWriter(S3Object(bucket.fs, bucket.uri("obj")), {}, SETTINGS)
    with open(path, "rb") as source:
        writer.write_from(source)
    with pytest.raises(RuntimeError, match="nothing can be added"):
        writer.write(b"more")
    writer.abort()


def test_a_read_that_ends_after_a_rewind_leaves_the_new_pass_alone() -> None:
    data = os.urandom(1000)
    started, release = threading.Event(), threading.Event()

    class SlowFirstRead(MemoryPartBody):
        keeps_crc = True
        slow = True

        def _take(self, position: int, size: int) -> bytes:
            if self.slow:
                self.slow = False
                started.set()
                release.wait(10)
            return super()._take(position, size)

    body = SlowFirstRead(memoryview(data))
    late = threading.Thread(target=body.read, args=(600,))  # a try that failed, still reading
    late.start()
    started.wait(10)
    body.rewind()  # the next try
    first = body.read(400)
    release.set()
    late.join(10)
    assert body.tell() == 400
    assert first + body.read() == data
    assert body.sent_crc() == zlib.crc32(data)


def test_a_file_upload_reports_the_bytes_the_store_has_taken(bucket: Bucket, tmp_path: Path) -> None:
    path = random_file(tmp_path, 4 * PART)
    reports: list[tuple[int, int | None]] = []
    target = FileFaults(S3Object(bucket.fs, bucket.uri("obj")))
    file_save(
        target, path, progress=ProgressReporter(lambda done, total: reports.append((done, total)), 4 * PART)
    )
    # Whole parts, counted as the store takes them (in any order, so the sums only grow).
    assert [count for count, _ in reports] == [PART, 2 * PART, 3 * PART, 4 * PART]


def test_a_snapshot_cut_short_during_its_upload_is_named_with_the_file_it_was_taken_of(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_file, snapshot = tmp_path / "weights.bin", tmp_path / "snapshot" / "weights.bin"
    snapshot.parent.mkdir()
    snapshot.write_bytes(os.urandom(3 * PART))
    upload_part = S3Object.upload_part

    async def cutting(self: S3Object, upload_id: str, number: int, body: PartBody) -> str:
        if number == 3:
            os.truncate(snapshot, PART)
        return await upload_part(self, upload_id, number, body)

    monkeypatch.setattr(S3Object, "upload_part", cutting)
    backend = S3Backend({**bucket.server.storage_options, "part_size": PART})
    with pytest.raises(InputChangedError) as raised:
        transfer.save(backend, bucket.uri("obj"), transfer.SaveRequest(content=snapshot, shown_as=user_file))
    assert f"the snapshot of {user_file}" in describe_error(raised.value)
