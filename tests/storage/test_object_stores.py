"""The same behaviours on every object store, against real servers on 127.0.0.1."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    BackendNotInstalledError,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointPermissionError,
    ctx,
    run_with_retries,
)
from flyte_checkpoint import archive as archive_module
from flyte_checkpoint.storage import DIGEST_KEY, FORMAT_KEY, backend_for, copy_object
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel import sizing
from flyte_checkpoint.storage.parallel.bodies import PartBody
from flyte_checkpoint.storage.stores import fsspec_store
from flyte_checkpoint.storage.stores.s3 import MAX_PARTS, S3Object
from tests.conftest import tree_of
from tests.storage.conftest import Remote

REPO = Path(__file__).resolve().parents[2]


def checkpoint(remote: Remote, dest: str, src: str | None = None) -> Checkpoint:
    return Checkpoint(
        remote.uri(dest), remote.uri(src) if src else None, storage_options=remote.storage_options
    )


def test_bytes_round_trip_into_the_payload_file(remote: Remote) -> None:
    checkpoint(remote, "a/obj").save_sync(b"hello-checkpoint")
    cp = checkpoint(remote, "unused", "a/obj")
    restored = cp.load_sync()
    assert restored == cp.path / "payload"
    assert restored.read_bytes() == b"hello-checkpoint"


async def test_a_file_round_trips_with_the_async_api(remote: Remote, tmp_path: Path) -> None:
    weights = tmp_path / "training.pt"
    weights.write_bytes(os.urandom(3 << 20))
    await checkpoint(remote, "file-obj").save(weights)
    cp = checkpoint(remote, "unused", "file-obj")
    restored = await cp.load()
    assert restored is not None
    assert restored.read_bytes() == weights.read_bytes()


def test_a_directory_round_trips_into_the_workspace(remote: Remote, model_dir: Path) -> None:
    checkpoint(remote, "dir-obj").save_sync(model_dir)
    cp = checkpoint(remote, "unused", "dir-obj")
    assert cp.load_sync() == cp.path
    assert tree_of(cp.path) == tree_of(model_dir)


async def test_a_directory_round_trips_with_the_async_api(remote: Remote, model_dir: Path) -> None:
    await checkpoint(remote, "dir-async").save(model_dir)
    cp = checkpoint(remote, "unused", "dir-async")
    assert await cp.load() == cp.path
    assert tree_of(cp.path) == tree_of(model_dir)


def test_a_missing_object_loads_as_none(remote: Remote) -> None:
    assert checkpoint(remote, "unused", "never-written").load_sync() is None


def test_an_empty_object_loads_as_none(remote: Remote) -> None:
    fs = remote.server.filesystem()
    with fs.open(remote.uri("empty"), "wb"):
        pass
    assert checkpoint(remote, "unused", "empty").load_sync() is None


def test_an_object_past_the_multipart_threshold_round_trips(remote: Remote, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom((100 << 20) + 12345))
    checkpoint(remote, "big").save_sync(big)
    restored = checkpoint(remote, "unused", "big").load_sync()
    assert restored is not None
    assert restored.stat().st_size == big.stat().st_size
    with open(restored, "rb") as a, open(big, "rb") as b:
        while chunk := a.read(1 << 24):
            assert chunk == b.read(1 << 24)


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_s3_parts_that_grow_mid_upload_round_trip(
    remote: Remote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizing, "_PART_GROWTH", 2)  # parts of half the bytes written so far
    upload_part, parts = S3Object.upload_part, []

    async def recording(self: S3Object, upload_id: str, number: int, body: PartBody) -> str:
        parts.append(len(body))
        return await upload_part(self, upload_id, number, body)

    monkeypatch.setattr(S3Object, "upload_part", recording)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "weights.bin").write_bytes(os.urandom(40 << 20))
    checkpoint(remote, "growing").save_sync(tree)  # a directory: an upload of unknown length
    # Parts of a fixed 8 MiB would be six, none above 8 MiB.
    assert max(parts) > 8 << 20
    assert len(parts) < -(-sum(parts) // (8 << 20))
    restored = checkpoint(remote, "unused", "growing").load_sync()
    assert restored is not None
    assert tree_of(restored) == tree_of(tree)


def test_s3_parts_stay_within_its_limits_up_to_its_largest_object() -> None:
    settings = TransferSettings()
    assert sizing.part_size_for(settings, MAX_PARTS, None, 0) == 8 << 20
    sent = parts = 0
    while sent < 5 << 40:  # 5 TiB, S3's largest object, in parts of at most 5 GiB, at most 10,000
        part = sizing.part_size_for(settings, MAX_PARTS, None, sent)
        assert part <= 5 << 30
        sent += part
        parts += 1
    assert parts <= MAX_PARTS
    # A known size fixes the part size up front: the smallest that fits in 10,000 parts.
    assert sizing.part_size_for(settings, MAX_PARTS, 200 << 30, 0) == 21 << 20
    assert sizing.part_size_for(settings, MAX_PARTS, 1 << 30, 0) == 8 << 20


def test_checkpoints_built_with_the_same_options_share_one_client(remote: Remote) -> None:
    options = remote.storage_options
    if remote.backend == "s3":
        # botocore's Config rewrites a ``retries`` dict in place (max_attempts -> total_max_attempts).
        options["config_kwargs"] = {"retries": {"max_attempts": 2, "mode": "standard"}}
    given = copy.deepcopy(options)
    first = backend_for(remote.uri("shared"), options)
    assert first.info(remote.uri("shared")) is None  # the first call builds the client
    assert options == given
    second = backend_for(remote.uri("shared"), options)
    assert isinstance(first, fsspec_store.FsspecBackend)
    assert isinstance(second, fsspec_store.FsspecBackend)
    assert second.fs is first.fs  # fsspec's instance cache hit: no second client and service model


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_an_s3_load_overtaken_by_an_overwrite_starts_over_and_loads_the_new_one(
    remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = os.urandom(12 << 20), os.urandom(12 << 20)
    checkpoint(remote, "replaced").save_sync(old)
    opened: tuple[Any, list[int]] = (S3Object.open, [])

    async def recording_open(self: S3Object, length: int) -> Any:
        opened[1].append(length)
        return await opened[0](self, length)

    monkeypatch.setattr(S3Object, "open", recording_open)
    # One range in flight: the second is asked for after the overwrite, pinned to the old ETag.
    options = {**remote.storage_options, "part_size": 5 << 20, "max_concurrency": 1}

    def replace_once(done: int, total: int | None) -> None:
        if len(opened[1]) == 1 and done >= 1 << 20:
            Checkpoint(remote.uri("replaced"), storage_options=options).save_sync(new)
            opened[1].append(0)  # replaced once

    cp = Checkpoint(remote.uri("unused"), remote.uri("replaced"), storage_options=options)
    restored = cp.load_sync(progress=replace_once)
    # The next range was refused (412, the object was replaced): the load started over.
    assert restored is not None
    assert restored.read_bytes() == new
    assert len(opened[1]) == 3  # first open, the overwrite, the second open


def test_the_format_and_digest_travel_with_a_payload(remote: Remote) -> None:
    checkpoint(remote, "meta").save_sync(b"abc")
    info = backend_for(remote.uri("meta"), remote.storage_options).info(remote.uri("meta"))
    assert info is not None
    assert info.recorded_format == "payload"
    assert info.metadata[DIGEST_KEY] == "crc32:352441c2"


def test_the_local_fsync_option_is_accepted_and_ignored_by_object_stores(remote: Remote) -> None:
    options = {**remote.storage_options, "fsync": True}
    Checkpoint(remote.uri("synced"), storage_options=options).save_sync(b"abc")
    cp = Checkpoint(remote.uri("unused"), remote.uri("synced"), storage_options=options)
    restored = cp.load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"abc"


def test_a_directory_archive_records_its_format(remote: Remote, model_dir: Path) -> None:
    checkpoint(remote, "dir-meta").save_sync(model_dir)
    info = backend_for(remote.uri("dir-meta"), remote.storage_options).info(remote.uri("dir-meta"))
    assert info is not None
    assert info.metadata[FORMAT_KEY] == "archive"


def test_a_payload_altered_in_the_store_is_reported_corrupt(remote: Remote) -> None:
    checkpoint(remote, "tampered").save_sync(b"original bytes")
    info = backend_for(remote.uri("tampered"), remote.storage_options).info(remote.uri("tampered"))
    assert info is not None
    # Same recorded digest, other content: what bit rot or a stray overwrite would leave behind.
    metadata_argument = "Metadata" if remote.backend == "s3" else "metadata"
    with remote.server.filesystem().open(
        remote.uri("tampered"), "wb", **{metadata_argument: dict(info.metadata)}
    ) as handle:
        handle.write(b"altered bytes!")
    with pytest.raises(CheckpointCorruptError, match="tampered"):
        checkpoint(remote, "unused", "tampered").load_sync()


def test_an_error_during_a_save_leaves_the_previous_object_intact(
    remote: Remote, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint(remote, "intact").save_sync(b"good checkpoint")
    original = archive_module.pack_directory

    def pack_then_crash(source: Path, sink: Any, *, level: int) -> None:
        sink.write(os.urandom(20 << 20))  # past one upload part, so a multipart upload is under way
        raise RuntimeError("trainer crashed mid-save")

    monkeypatch.setattr(archive_module, "pack_directory", pack_then_crash)
    with pytest.raises(RuntimeError, match="mid-save"):
        checkpoint(remote, "intact").save_sync(model_dir)
    monkeypatch.setattr(archive_module, "pack_directory", original)
    restored = checkpoint(remote, "unused", "intact").load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"good checkpoint"


def test_an_error_during_a_first_save_leaves_no_object(
    remote: Remote, monkeypatch: pytest.MonkeyPatch
) -> None:
    def pack_then_crash(source: Path, sink: Any, *, level: int) -> None:
        sink.write(b"partial")
        raise RuntimeError("crash")

    monkeypatch.setattr(archive_module, "pack_directory", pack_then_crash)
    with pytest.raises(RuntimeError):
        checkpoint(remote, "never").save_sync(REPO / "examples")
    assert not remote.server.filesystem().exists(remote.uri("never"))


def test_staging_copies_the_object_and_its_record(remote: Remote) -> None:
    checkpoint(remote, "run/checkpoint").save_sync(b"staged")
    options = remote.storage_options
    assert copy_object(
        remote.uri("run/checkpoint"), remote.uri("run/prev"), src_options=options, dst_options=options
    )
    backend = backend_for(remote.uri("run/prev"), options)
    copied, original = backend.info(remote.uri("run/prev")), backend.info(remote.uri("run/checkpoint"))
    assert copied is not None
    assert original is not None
    assert copied.metadata[DIGEST_KEY] == original.metadata[DIGEST_KEY]


def test_staging_between_local_disk_and_the_store_keeps_the_digest(remote: Remote, tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "local")).save_sync(b"from disk")
    assert copy_object(str(tmp_path / "local"), remote.uri("copied"), dst_options=remote.storage_options)
    restored = checkpoint(remote, "unused", "copied").load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"from disk"


def test_the_retry_runner_resumes_a_failing_task_from_the_store(remote: Remote) -> None:
    starts: list[int] = []

    def count(n: int) -> int:
        context = ctx()
        assert context is not None
        cp = context.checkpoint
        assert cp is not None
        restored = cp.load_sync()
        start = int(restored.read_bytes()) if restored else 0
        starts.append(start)
        for value in range(start, n):
            if value > start and value % 3 == 0:
                raise RuntimeError(f"planned failure at {value}")
            cp.save_sync(str(value + 1).encode())
        return n

    result = run_with_retries(
        count, 8, retries=3, checkpoint_dir=remote.uri("runs/r1"), storage_options=remote.storage_options
    )
    assert result == 8
    assert starts == [0, 3, 6]


def test_a_missing_backend_package_names_a_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, remote: Remote
) -> None:
    # The package is on no registry: `pip install 'flyte-checkpoint[s3]'` fails, the backend's own
    # requirement (on PyPI) or the extra of a checkout (`pip install '.[s3]'`) works.
    store = type(backend_for(remote.uri("x"), remote.storage_options))
    assert issubclass(store, fsspec_store.FsspecBackend)
    missing = dataclasses.replace(store.profile, implementation="flyte_checkpoint_no_such_module:FileSystem")
    monkeypatch.setattr(store, "profile", missing)
    backends = {"s3": ("s3", "s3fs"), "gcs": ("gcs", "gcsfs"), "azure": ("azure", "adlfs")}
    extra, backend = backends[remote.backend]
    with pytest.raises(BackendNotInstalledError) as raised:
        checkpoint(remote, "x")
    message = str(raised.value)
    assert f"pip install '{backend}>=2024.2.0'" in message
    assert f"pip install '.[{extra}]'" in message
    assert "pip install 'flyte-checkpoint[" not in message


def test_wrong_azure_credentials_name_the_uri_and_what_to_set(azure_server: Any) -> None:
    from tests.storage.conftest import remote_for

    remote = remote_for("azure", azure_server)
    options = remote.storage_options
    options["connection_string"] = options["connection_string"].replace("AccountKey=", "AccountKey=AAAA")
    options["retry_total"] = 0
    with pytest.raises(CheckpointPermissionError, match=r"AZURE_STORAGE_CONNECTION_STRING") as caught:
        Checkpoint(remote.uri("secret"), storage_options=options).save_sync(b"x")
    assert remote.uri("secret") in str(caught.value)


def test_the_backends_own_environment_variables_configure_it(remote: Remote) -> None:
    checkpoint(remote, "env-obj").save_sync(b"configured by environment")
    script = (
        "from flyte_checkpoint import Checkpoint\n"
        f"print(Checkpoint('unused', {remote.uri('env-obj')!r}).load_sync().read_bytes().decode())\n"
    )
    env = {**os.environ, **remote.server.env, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "configured by environment"


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_an_upload_that_cannot_be_aborted_is_logged_with_its_uri(
    remote: Remote, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    uri = remote.uri("stuck")
    backend = backend_for(uri, {**remote.storage_options, "part_size": 5 << 20})
    writer = backend.open_write(uri, {})
    writer.write(os.urandom(6 << 20))  # past one part: a multipart upload was started

    async def refuse(self: S3Object, upload_id: str) -> None:  # the store cannot be reached to abort
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(S3Object, "abort", refuse)
    with caplog.at_level(logging.WARNING, logger="flyte_checkpoint"):
        writer.abort()
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert uri in caplog.text
    assert backend.info(uri) is None  # nothing was published
