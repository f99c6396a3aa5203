"""Parallel GCS and Azure saves and loads against fake-gcs-server and Azurite.

Atomic (composed / committed only at the end), ordered, pinned to one version, cleaned up and
bounded in memory. Faults the emulators cannot produce on cue are injected by wrapping the real
store adapter.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import pytest
from fsspec.asyn import sync

from flyte_checkpoint.errors import CheckpointPermissionError, CheckpointUnavailableError, InputChangedError
from flyte_checkpoint.storage.base import FORMAT_KEY, VerifyingReader
from flyte_checkpoint.storage.digests import digest_of
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError
from flyte_checkpoint.storage.parallel.sizing import transfer_memory
from flyte_checkpoint.storage.parallel.writer import ParallelWriter
from flyte_checkpoint.storage.stores import gcs as gcs_store
from flyte_checkpoint.storage.stores.azure import AzureBackend, BlocksDiscardedError
from flyte_checkpoint.storage.stores.fsspec_store import FsspecBackend
from flyte_checkpoint.storage.stores.gcs import GCSBackend
from tests.storage.conftest import Remote, remote_for
from tests.storage.parallel_faults import FaultyTarget

PART = 1 << 20  # the smallest part the settings allow: emulators are slow
SETTINGS = {"part_size": PART, "max_concurrency": 3, "part_attempts": 3}
REPO = Path(__file__).resolve().parents[2]
_BACKENDS: dict[str, type[FsspecBackend]] = {"gcs": GCSBackend, "azure": AzureBackend}


@dataclass
class Store:
    remote: Remote
    backend: FsspecBackend

    def uri(self, key: str) -> str:
        return self.remote.uri(key)

    def stored(self, key: str) -> bytes:
        return bytes(self.backend.fs.cat_file(self.uri(key)))

    def keys(self) -> list[str]:
        """Every object in the bucket, temporary ones included (the raw listing, not ours)."""
        found = self.backend.fs.find(self.remote.bucket)
        return sorted(str(path).split("/", 1)[1] for path in found)


def store_for(remote: Remote, **overrides: Any) -> Store:
    options = {**remote.storage_options, **SETTINGS, **overrides}
    return Store(remote, _BACKENDS[remote.backend](options))


@pytest.fixture(params=["gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Store:
    backend = str(request.param)
    server = request.getfixturevalue({"gcs": "gcs_server", "azure": "azure_server"}[backend])
    return store_for(remote_for(backend, server))


@pytest.fixture
def gcs(gcs_server: Any) -> Store:
    return store_for(remote_for("gcs", gcs_server))


@pytest.fixture
def azure(azure_server: Any) -> Store:
    return store_for(remote_for("azure", azure_server))


def save(store: Store, key: str, data: bytes, *, declared: bool = False, chunk: int = 300_000) -> None:
    writer = store.backend.open_write(
        store.uri(key),
        {FORMAT_KEY: "payload"},
        declared_digest=digest_of(data) if declared else None,
        declared_size=len(data) if declared else None,
    )
    with writer:
        for start in range(0, len(data), chunk):
            writer.write(data[start : start + chunk])


def load(reader: VerifyingReader | None, chunk: int = 300_000) -> tuple[bytes, VerifyingReader]:
    assert reader is not None
    out = bytearray()
    buffer = bytearray(chunk)
    with reader:
        while count := reader.readinto(buffer):
            out += buffer[:count]
    return bytes(out), reader


# -- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 4 * PART + 12345])
def test_an_object_of_any_size_round_trips_with_its_digest_verified(store: Store, size: int) -> None:
    data = os.urandom(size)
    save(store, "obj", data)
    got, verifying = load(store.backend.open_read(store.uri("obj")))
    assert got == data
    assert verifying.verified
    assert verifying.info.recorded_digest == digest_of(data)
    assert verifying.info.recorded_format == "payload"
    assert verifying.info.size == size


def test_a_declared_upload_round_trips_in_parts(store: Store) -> None:
    data = os.urandom(2 * PART + 1)
    save(store, "declared", data, declared=True, chunk=65_536)
    got, verifying = load(store.backend.open_read(store.uri("declared")), chunk=1 << 20)
    assert got == data
    assert verifying.verified


def test_a_missing_object_opens_as_none(store: Store) -> None:
    assert store.backend.open_read(store.uri("never-written")) is None


def test_a_save_in_parts_leaves_only_the_object_behind(store: Store) -> None:
    save(store, "dir/obj", os.urandom(3 * PART + 1))
    assert store.keys() == ["dir/obj"]


# -- faults -------------------------------------------------------------------------------------


def faulty_save(store: Store, target: FaultyTarget, data: bytes) -> None:
    with ParallelWriter(target, {FORMAT_KEY: "payload"}, store.backend.transfer) as writer:
        for start in range(0, len(data), 300_000):
            writer.write(data[start : start + 300_000])


def target(store: Store, key: str, **faults: Any) -> FaultyTarget:
    return FaultyTarget(store.backend.parallel_object(store.uri(key)), **faults)


def test_a_failed_part_aborts_the_upload_and_keeps_the_old_object(store: Store) -> None:
    save(store, "obj", b"old checkpoint")
    failing = target(store, "obj", fail_part=2)
    with pytest.raises(CheckpointPermissionError):
        faulty_save(store, failing, os.urandom(4 * PART))
    assert store.stored("obj") == b"old checkpoint"
    assert store.keys() == ["obj"]  # GCS: no temporary part object left
    assert failing.attempts[2] == 1  # refused access is not retried


def test_a_failed_completion_keeps_the_old_object_and_leaves_no_parts(store: Store) -> None:
    save(store, "obj", b"old checkpoint")
    with pytest.raises(CheckpointPermissionError):
        faulty_save(store, target(store, "obj", fail_complete=True), os.urandom(3 * PART))
    assert store.stored("obj") == b"old checkpoint"
    assert store.keys() == ["obj"]


def test_an_upload_that_cannot_be_aborted_is_logged_with_its_uri(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    stuck = target(store, "obj", fail_part=2, fail_abort=True)
    with caplog.at_level(logging.WARNING, logger="flyte_checkpoint"):  # noqa: SIM117 - raises() wraps one call only
        with pytest.raises(CheckpointPermissionError):
            faulty_save(store, stuck, os.urandom(3 * PART))
    # Ours only: a client session another test leaked may be collected (and logged) meanwhile.
    ours = [record for record in caplog.records if record.name == "flyte_checkpoint"]
    assert [record.levelno for record in ours] == [logging.WARNING]
    assert store.uri("obj") in ours[0].getMessage()


def test_a_transient_part_failure_is_retried_on_its_own(store: Store) -> None:
    flaky = target(store, "obj", fail_part=2, error=ConnectionResetError("injected reset"), times=1)
    data = os.urandom(3 * PART)
    faulty_save(store, flaky, data)
    assert store.stored("obj") == data
    assert flaky.attempts == {1: 1, 2: 2, 3: 1}


def test_a_part_retried_after_its_body_was_sent_is_sent_again_from_its_start(store: Store) -> None:
    error = ConnectionResetError("injected: the reply was lost")
    flaky = target(store, "obj", fail_part=2, error=error, times=1, fail_after_sending=True)
    data = os.urandom(3 * PART)
    faulty_save(store, flaky, data)
    assert store.stored("obj") == data
    assert flaky.attempts == {1: 1, 2: 2, 3: 1}


def test_a_file_cut_short_during_its_upload_fails_as_changed_input_not_as_a_lost_connection(
    store: Store, tmp_path: Path
) -> None:
    # The HTTP client reads the body itself here (no signing pass before it) and reports a
    # failed read as a connection error: the save must still name the real cause, at once.
    save(store, "obj", b"old checkpoint")
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(4 * PART))
    cut = target(store, "obj", before_part={3: lambda: os.truncate(path, PART)})
    writer = ParallelWriter(cut, {FORMAT_KEY: "payload"}, store.backend.transfer)
    with pytest.raises(InputChangedError, match="got shorter"), open(path, "rb") as source, writer:
        writer.write_from(source)
    assert store.stored("obj") == b"old checkpoint"
    assert cut.attempts[3] == 1


def test_parts_that_finish_out_of_order_are_completed_in_order(store: Store) -> None:
    held = target(store, "obj", hold_part_until_done=(1, 3))
    data = os.urandom(3 * PART + 1)
    faulty_save(store, held, data)
    assert held.finished.index(3) < held.finished.index(1)
    assert store.stored("obj") == data


def test_an_interrupt_while_writing_aborts_the_upload(store: Store) -> None:
    save(store, "obj", b"old checkpoint")
    writer = store.backend.open_write(store.uri("obj"), {})

    def interrupted_save() -> None:
        with writer:
            writer.write(os.urandom(2 * PART + 1))
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_save()
    assert store.stored("obj") == b"old checkpoint"
    assert store.keys() == ["obj"]


@pytest.mark.parametrize("replacement", [b"b" * (3 * PART), b"small"], ids=["in-parts", "one-request"])
def test_an_overwrite_during_a_load_fails_it_instead_of_mixing_versions(
    remote_store: Store, replacement: bytes
) -> None:
    store = remote_store
    save(store, "obj", b"a" * (3 * PART))
    reader = store.backend.open_read(store.uri("obj"))
    save(store, "obj", replacement)
    with pytest.raises(ObjectReplacedError, match="replaced while it was being read"):
        load(reader)


@pytest.fixture(params=["gcs", "azure"])
def remote_store(request: pytest.FixtureRequest) -> Store:
    """A store whose loads keep one range in flight, so an overwrite lands mid-load."""
    backend = str(request.param)
    server = request.getfixturevalue({"gcs": "gcs_server", "azure": "azure_server"}[backend])
    return store_for(remote_for(backend, server), max_concurrency=1)


# -- GCS: temporary part objects ----------------------------------------------------------------


class ClockTwoHoursAhead(datetime):
    """``datetime`` as a client whose clock runs two hours ahead of the store's sees it."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> ClockTwoHoursAhead:
        return super().now(tz) + timedelta(hours=2)


def leftover_part(store: Store, key: str, upload_id: str = "0" * 32) -> str:
    """A temporary part object as a killed save leaves it."""
    name = f"{key}{gcs_store.PARTS_SUFFIX}/{upload_id}/00001"
    store.backend.fs.pipe_file(store.uri(name), b"part of a killed save")
    return name


def test_gcs_parts_beyond_one_compose_are_composed_in_rounds(
    gcs: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gcs_store, "COMPOSE_SOURCES", 2)  # 5 parts: 3 rounds, not 32+ parts
    data = os.urandom(4 * PART + 7)
    save(gcs, "obj", data)
    got, verifying = load(gcs.backend.open_read(gcs.uri("obj")))
    assert got == data
    assert verifying.verified
    assert gcs.keys() == ["obj"]


def test_gcs_temporary_parts_are_left_out_of_listings(gcs: Store) -> None:
    save(gcs, "run/v1/obj", b"checkpoint")
    leftover_part(gcs, "run/v1/obj")
    assert gcs.backend.list_prefix(gcs.uri("run")) == [gcs.uri("run/v1/obj")]
    assert gcs.backend.list_children(gcs.uri("run/v1")) == ["obj"]


def test_gcs_a_save_deletes_parts_older_than_the_stale_age(gcs: Store) -> None:
    leftover_part(gcs, "obj")
    stale_now = store_for(gcs.remote, stale_upload_age=0)
    save(stale_now, "obj", os.urandom(PART + 1))
    assert gcs.keys() == ["obj"]


def test_gcs_a_save_leaves_parts_younger_than_the_stale_age_alone(gcs: Store) -> None:
    recent = leftover_part(gcs, "obj")
    save(store_for(gcs.remote, stale_upload_age=3600), "obj", os.urandom(PART + 1))
    assert gcs.keys() == ["obj", recent]


def test_gcs_part_ages_are_read_on_the_stores_clock_not_the_clients(
    gcs: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = leftover_part(gcs, "obj")  # another save's part, sent just now
    monkeypatch.setattr(gcs_store, "datetime", ClockTwoHoursAhead)
    save(store_for(gcs.remote, stale_upload_age=3600), "obj", os.urandom(PART + 1))
    assert gcs.keys() == ["obj", running]


def test_gcs_a_save_leaves_parts_of_other_objects_alone(gcs: Store) -> None:
    other = leftover_part(gcs, "obj-other")
    save(store_for(gcs.remote, stale_upload_age=0), "obj", os.urandom(PART + 1))
    assert gcs.keys() == ["obj", other]


# -- Azure: uncommitted blocks ------------------------------------------------------------------


def uncommitted_blocks(store: Store, key: str) -> int:
    blob = store.backend.parallel_object(store.uri(key))

    async def count() -> int:
        client = store.backend.fs.service_client.get_blob_client(store.remote.bucket, key)
        _, uncommitted = await client.get_block_list("uncommitted")
        return len(uncommitted)

    return int(sync(blob.loop, count))


def test_azure_blocks_of_a_failed_save_stay_invisible_until_the_next_commit_discards_them(
    azure: Store,
) -> None:
    save(azure, "obj", os.urandom(2 * PART))
    # Part 4 fails once part 2 is staged: some blocks are left uncommitted.
    failing = target(azure, "obj", fail_part=4, hold_part_until_done=(4, 2))
    with pytest.raises(CheckpointPermissionError):
        faulty_save(azure, failing, os.urandom(5 * PART))
    assert uncommitted_blocks(azure, "obj") > 0
    data = os.urandom(2 * PART + 1)
    save(azure, "obj", data)
    assert azure.stored("obj") == data
    assert uncommitted_blocks(azure, "obj") == 0


def test_azure_a_save_whose_blocks_a_concurrent_commit_discarded_fails_as_retryable(azure: Store) -> None:
    first = azure.backend.open_write(azure.uri("obj"), {})
    first.write(os.urandom(2 * PART + 1))  # blocks staged, not committed
    winner = os.urandom(2 * PART + 1)
    save(azure, "obj", winner)  # its commit discards the first save's uncommitted blocks
    with pytest.raises(BlocksDiscardedError, match="committed first"):
        first.commit()
    assert isinstance(BlocksDiscardedError("x"), CheckpointUnavailableError)  # the save is retried
    assert azure.stored("obj") == winner


# -- memory -------------------------------------------------------------------------------------

_MEASURE = """
import json, resource, sys
import tests.storage_servers  # gcsfs must not pick its gRPC-probing class
from flyte_checkpoint.storage import backend_for

options, uri, path = json.loads(sys.argv[1])
backend = backend_for(uri, options)

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def save(target, source):
    with open(source, "rb") as handle, backend.open_write(target, {}) as writer:
        writer.write_from(handle)

def load(target):
    with backend.open_read(target) as verifying:
        buffer = bytearray(1 << 20)
        while verifying.readinto(buffer):
            pass
        assert verifying.verified

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


def test_a_large_save_and_load_stay_within_the_documented_memory(store: Store, tmp_path: Path) -> None:
    settings = TransferSettings(part_size=2 * PART, max_concurrency=4)
    size = 48 << 20  # larger than the buffers and the margin together: a whole copy would show
    source = tmp_path / "big"
    with open(source, "wb") as handle:
        for _ in range(size >> 20):
            handle.write(os.urandom(1 << 20))
    options = {**store.remote.storage_options, **settings.model_dump(exclude_defaults=True)}
    arguments = [options, store.uri("big"), str(source)]
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
    assert peaks["save"] - peaks["before"] < allowed, peaks
    assert peaks["load"] - peaks["before"] < allowed, peaks
