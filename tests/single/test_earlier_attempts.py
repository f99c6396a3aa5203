"""A load resumes from the newest earlier attempt that saved when the previous one did not
(flyte#2894), over real S3 (moto) in Flyte's per-attempt layout."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointPaths,
    CheckpointUnavailableError,
    RestoredFrom,
    RetryPolicy,
    TaskContext,
    repair_prev_checkpoint_uri,
)
from flyte_checkpoint.single.earlier_attempts import MAX_WALK_BACK, discard_earlier_uploads
from flyte_checkpoint.storage import backend_for
from flyte_checkpoint.uris import AttemptURI, attempt_uris, flyte_shard
from tests.faults.proxy import FaultProxy, status
from tests.storage_servers import StorageServer, create_bucket

RUN = "r969nmh2r5m6mqqnnb4h"
ACTION = "a0"
QUICK = RetryPolicy(attempts=2, initial_delay=0.01, max_delay=0.01)


def flyte_uri(bucket: str, attempt: int) -> str:
    """Where Flyte puts the checkpoint of 0-based ``attempt``: its directory counts from 1."""
    unique_id = f"{RUN}-{ACTION}-{attempt}"
    directory = f"{RUN}/{ACTION}/{attempt + 1}/{flyte_shard(unique_id)}/{unique_id}"
    return f"s3://{bucket}/ns/prefix/{directory}/_flytecheckpoints"


@pytest.fixture
def bucket(s3_server: StorageServer) -> str:
    return create_bucket(s3_server, "walk")


@pytest.fixture
def options(s3_server: StorageServer) -> dict[str, Any]:
    return s3_server.storage_options


@pytest.fixture
def walk_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="flyte_checkpoint")
    return caplog


def save(uri: str, data: bytes, options: dict[str, Any]) -> None:
    with Checkpoint(uri, storage_options=options) as checkpoint:
        checkpoint.save_sync(data)


def damage(uri: str, server: StorageServer) -> None:
    """Change the object's bytes but keep what was recorded with it, as bit rot would."""
    info = backend_for(uri, server.storage_options).info(uri)
    assert info is not None
    with server.filesystem().open(uri, "rb") as source:
        data = source.read()
    with server.filesystem().open(uri, "wb", Metadata=dict(info.metadata)) as out:
        out.write(data.swapcase())


def resuming(bucket: str, prev_attempt: int, options: dict[str, Any], **extra: Any) -> Checkpoint:
    """The helper of the attempt after ``prev_attempt``, as that attempt would build it."""
    return Checkpoint(
        flyte_uri(bucket, prev_attempt + 1),
        flyte_uri(bucket, prev_attempt),
        storage_options=options,
        run_name=RUN,
        action_name=ACTION,
        **extra,
    )


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "flyte_checkpoint" and r.levelno == level]


# -- the candidate URIs (pure) ---------------------------------------------------------------


def test_an_earlier_attempt_of_flytes_layout_gets_its_own_directory_id_and_shard() -> None:
    # Both URIs as flyte-sdk's own tests spell them (attempt 1, then attempt 0 in shard "ge").
    prev = f"s3://bucket/ns/prefix/{RUN}/a0/2/5d/{RUN}-a0-1/_flytecheckpoints"
    assert attempt_uris(prev, run_name=RUN, action_name="a0", earlier=MAX_WALK_BACK) == [
        AttemptURI(2, prev),
        AttemptURI(1, f"s3://bucket/ns/prefix/{RUN}/a0/1/ge/{RUN}-a0-0/_flytecheckpoints"),
    ]


def test_a_plain_attempt_directory_walks_back_to_zero() -> None:
    prev = "gs://b/runs/run-1/train/2/prev_checkpoint"
    assert attempt_uris(prev, run_name="run-1", action_name="train", earlier=MAX_WALK_BACK) == [
        AttemptURI(2, prev),
        AttemptURI(1, "gs://b/runs/run-1/train/1/prev_checkpoint"),
        AttemptURI(0, "gs://b/runs/run-1/train/0/prev_checkpoint"),
    ]


def test_a_flyte_shard_followed_by_another_attempts_id_is_not_walked_back() -> None:
    # Directory 3 with the id of attempt 1: the numbers disagree, so no earlier URI can be derived.
    prev = f"s3://bucket/ns/prefix/{RUN}/a0/3/5d/{RUN}-a0-1/_flytecheckpoints"
    assert attempt_uris(prev, run_name=RUN, action_name="a0", earlier=MAX_WALK_BACK) == [AttemptURI(3, prev)]


@pytest.mark.parametrize(
    ("prev", "run_name"),
    [
        ("abfs://container/runs/run-1/train/3/ckpt", "run-1"),  # not a scheme the repair knows
        ("s3://b/runs/run-1/train/3/ckpt", None),  # names unknown
        ("s3://b/runs/other/train/3/ckpt", "run-1"),  # no per-attempt directory
    ],
)
def test_only_a_per_attempt_uri_with_known_names_on_a_walkable_store_has_earlier_attempts(
    prev: str, run_name: str | None
) -> None:
    (only,) = attempt_uris(prev, run_name=run_name, action_name="train", earlier=MAX_WALK_BACK)
    assert only.uri == prev


@pytest.mark.parametrize("prev", ["/data/runs/run-1/train/2/ckpt", "file:///data/runs/run-1/train/2/ckpt"])
def test_a_local_per_attempt_location_has_its_earlier_attempts(prev: str) -> None:
    found = attempt_uris(prev, run_name="run-1", action_name="train", earlier=MAX_WALK_BACK)
    assert [candidate.attempt for candidate in found] == [2, 1, 0]
    assert found[-1].uri == prev.replace("/2/", "/0/")


def test_a_correct_previous_uri_in_flytes_layout_is_not_repaired_to_an_older_attempt() -> None:
    # Attempt 2 (0-based) resumes from attempt 1, under directory 2: the segment equals the
    # attempt number, but the id after it shows the URI already names attempt 1's directory.
    prev = f"s3://bucket/ns/prefix/{RUN}/a0/2/5d/{RUN}-a0-1/_flytecheckpoints"
    assert repair_prev_checkpoint_uri(prev, run_name=RUN, action_name="a0", attempt_number=2) == prev


# -- walking back over real storage ----------------------------------------------------------


def test_a_load_walks_back_over_an_attempt_that_never_saved(
    bucket: str, options: dict[str, Any], walk_log: pytest.LogCaptureFixture
) -> None:
    save(flyte_uri(bucket, 1), b"state of attempt 1", options)
    with resuming(bucket, 2, options) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 1"
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 1), attempt=2)
    expected = "no checkpoint at attempt 3 (attempt 3: no object); resuming from attempt 2 at "
    assert f"{expected}{flyte_uri(bucket, 1)}" in messages(walk_log, logging.INFO)


def test_a_load_walks_back_over_an_empty_object(
    bucket: str, s3_server: StorageServer, options: dict[str, Any]
) -> None:
    save(flyte_uri(bucket, 0), b"state of attempt 0", options)
    s3_server.filesystem().pipe_file(flyte_uri(bucket, 1), b"")
    with resuming(bucket, 1, options) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 0"
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 0), attempt=1)


def test_a_damaged_checkpoint_is_skipped_with_a_warning_naming_it(
    bucket: str, s3_server: StorageServer, options: dict[str, Any], walk_log: pytest.LogCaptureFixture
) -> None:
    save(flyte_uri(bucket, 0), b"state of attempt 0", options)
    save(flyte_uri(bucket, 1), b"state of attempt 1", options)
    damage(flyte_uri(bucket, 1), s3_server)
    with resuming(bucket, 1, options) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 0"
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 0), attempt=1)
    (warning,) = messages(walk_log, logging.WARNING)
    assert warning.startswith(f"checkpoint of attempt 2 at {flyte_uri(bucket, 1)} is damaged")
    assert warning.endswith("skipping it, trying attempt 1")


def test_when_every_attempt_that_saved_is_damaged_the_error_names_each(
    bucket: str, s3_server: StorageServer, options: dict[str, Any]
) -> None:
    for attempt in (0, 2):  # attempt 1 never saved, attempt 3 did not either
        save(flyte_uri(bucket, attempt), b"state", options)
        damage(flyte_uri(bucket, attempt), s3_server)
    with (
        resuming(bucket, 3, options) as checkpoint,
        pytest.raises(CheckpointCorruptError, match="no sound checkpoint to resume from") as caught,
    ):
        checkpoint.load_sync()
    assert f"attempt 3 at {flyte_uri(bucket, 2)}" in str(caught.value)
    assert f"attempt 1 at {flyte_uri(bucket, 0)}" in str(caught.value)
    assert checkpoint.restored_from is None


def test_when_no_attempt_saved_the_load_finds_nothing(
    bucket: str, options: dict[str, Any], walk_log: pytest.LogCaptureFixture
) -> None:
    with resuming(bucket, 3, options) as checkpoint:
        assert checkpoint.load_sync() is None
        assert checkpoint.restored_from is None
    assert any(
        line.startswith("no checkpoint at attempt 4 nor at the 3 attempts before it")
        and "starting fresh" in line
        for line in messages(walk_log, logging.INFO)
    )


def test_the_walk_reaches_sixteen_attempts_back(bucket: str, options: dict[str, Any]) -> None:
    save(flyte_uri(bucket, 19 - MAX_WALK_BACK), b"old state", options)
    with resuming(bucket, 19, options) as checkpoint:
        assert checkpoint.load_sync() is not None
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 3), attempt=4)


def test_the_walk_goes_no_further_than_sixteen_attempts_back(
    bucket: str, options: dict[str, Any], walk_log: pytest.LogCaptureFixture
) -> None:
    save(flyte_uri(bucket, 19 - MAX_WALK_BACK - 1), b"too old a state", options)
    with resuming(bucket, 19, options) as checkpoint:
        assert checkpoint.load_sync() is None
    assert any(
        f"nor at the {MAX_WALK_BACK} attempts before it" in line and flyte_uri(bucket, 3) in line
        for line in messages(walk_log, logging.INFO)
    )


@pytest.fixture
def s3_proxy(s3_server: StorageServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", s3_server.port)) as running:
        yield running


def test_storage_failing_during_the_walk_raises_instead_of_walking_on(
    bucket: str, options: dict[str, Any], s3_proxy: FaultProxy
) -> None:
    save(flyte_uri(bucket, 0), b"state of attempt 0", options)
    through_proxy = {
        **options,
        "endpoint_url": s3_proxy.url,
        "config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}},
        "transfer_timeout": 10,
    }
    # Attempt 2 never saved (its lookup reaches the store); attempt 1's lookup finds it down.
    s3_proxy.add_fault(status(503), times=None, path_contains=f"/{RUN}-{ACTION}-1/")
    with (
        resuming(bucket, 2, through_proxy, retry=QUICK) as checkpoint,
        pytest.raises(CheckpointUnavailableError),
    ):
        checkpoint.load_sync()
    looked_up = [record.path for record in s3_proxy.requests]
    assert any(f"/{RUN}-{ACTION}-2/" in path for path in looked_up)
    assert not any(f"/{RUN}-{ACTION}-0/" in path for path in looked_up)  # attempt 0 was never asked


@pytest.mark.parametrize("spelling", ["path", "file-uri"])
def test_a_local_source_in_the_per_attempt_layout_walks_back_to_the_newest_attempt_that_saved(
    tmp_path: Path, spelling: str
) -> None:
    """What `flyte-checkpoint run` users write locally: file://…/{run}/{action}/{n}/checkpoint."""
    attempt_dir = tmp_path / "runs" / RUN / ACTION
    save(str(attempt_dir / "1" / "ckpt"), b"state of attempt 1", {})
    previous = str(attempt_dir / "2" / "ckpt")
    source = previous if spelling == "path" else f"file://{previous}"
    with Checkpoint(attempt_dir / "3" / "ckpt", source, run_name=RUN, action_name=ACTION) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 1"
        assert checkpoint.restored_from is not None
        assert checkpoint.restored_from.attempt == 1


def test_a_retried_attempt_that_finds_nothing_to_resume_from_says_so_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    attempt_dir = tmp_path / "runs" / RUN / ACTION
    caplog.set_level(logging.INFO, logger="flyte_checkpoint")
    with Checkpoint(
        attempt_dir / "3" / "ckpt",
        attempt_dir / "2" / "ckpt",
        run_name=RUN,
        action_name=ACTION,
        attempt_number=3,
    ) as checkpoint:
        assert checkpoint.load_sync() is None
    (warning,) = messages(caplog, logging.WARNING)
    assert "attempt 3 found no checkpoint" in warning
    assert "starts from the beginning" in warning


def test_the_first_attempt_finding_no_checkpoint_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="flyte_checkpoint")
    with Checkpoint(tmp_path / "ckpt", tmp_path / "prev", attempt_number=0) as checkpoint:
        assert checkpoint.load_sync() is None
    assert messages(caplog, logging.WARNING) == []


def test_a_direct_restore_reports_the_previous_attempt(bucket: str, options: dict[str, Any]) -> None:
    save(flyte_uri(bucket, 2), b"state of attempt 2", options)
    with resuming(bucket, 2, options) as checkpoint:
        assert checkpoint.restored_from is None  # nothing loaded yet
        checkpoint.load_sync()
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 2), attempt=3)


async def test_an_async_load_walks_back_too(bucket: str, options: dict[str, Any]) -> None:
    save(flyte_uri(bucket, 0), b"state of attempt 0", options)
    checkpoint = resuming(bucket, 1, options)
    try:
        restored = await checkpoint.load()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 0"
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 0), attempt=1)
    finally:
        await checkpoint.aclose()


@pytest.mark.parametrize(
    "prev_of",
    [
        pytest.param(lambda bucket: flyte_uri(bucket, 2), id="as-the-executor-should"),
        pytest.param(  # the current attempt's directory with the previous attempt's id
            lambda bucket: flyte_uri(bucket, 2).replace(f"/{ACTION}/3/", f"/{ACTION}/4/"),
            id="as-the-faulty-executor-did",
        ),
    ],
)
def test_the_task_context_helper_resumes_from_the_newest_attempt_that_saved(
    bucket: str, options: dict[str, Any], prev_of: Any
) -> None:
    save(flyte_uri(bucket, 1), b"state of attempt 1", options)
    context = TaskContext(
        checkpoint_paths=CheckpointPaths(
            prev_checkpoint_path=prev_of(bucket), checkpoint_path=flyte_uri(bucket, 3)
        ),
        run_name=RUN,
        action_name=ACTION,
        storage_options=options,
        attempt_number=3,
    )
    checkpoint = context.checkpoint
    assert checkpoint is not None
    with checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state of attempt 1"
        assert checkpoint.restored_from == RestoredFrom(uri=flyte_uri(bucket, 1), attempt=2)


# -- unfinished uploads that earlier attempts left ---------------------------------------------


def leave_upload(server: StorageServer, uri: str) -> str:
    """An incomplete multipart upload at ``uri``, as a save SIGKILLed mid-upload leaves it."""
    fs = server.filesystem()
    bucket, key, _ = fs.split_path(uri)
    return str(fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"])


def uploads_at(server: StorageServer, uri: str) -> list[str]:
    fs = server.filesystem()
    bucket, key, _ = fs.split_path(uri)
    page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
    return [str(upload["UploadId"]) for upload in page.get("Uploads", []) if upload["Key"] == key]


def discard_before(bucket: str, attempt: int, options: dict[str, Any]) -> threading.Thread | None:
    dest = flyte_uri(bucket, attempt)
    return discard_earlier_uploads(backend_for(dest, options), dest, run_name=RUN, action_name=ACTION)


def test_the_unfinished_uploads_of_every_earlier_attempt_are_discarded_and_this_attempts_kept(
    bucket: str, options: dict[str, Any], s3_server: StorageServer
) -> None:
    for attempt in (0, 1, 2):
        leave_upload(s3_server, flyte_uri(bucket, attempt))
    own = leave_upload(s3_server, flyte_uri(bucket, 3))
    thread = discard_before(bucket, 3, options)
    assert thread is not None
    thread.join(60)
    assert [uploads_at(s3_server, flyte_uri(bucket, attempt)) for attempt in (0, 1, 2, 3)] == [
        [],
        [],
        [],
        [own],
    ]


def test_earlier_attempts_are_cleaned_once_per_process_and_destination(
    bucket: str, options: dict[str, Any], s3_server: StorageServer
) -> None:
    first = discard_before(bucket, 1, options)
    assert first is not None
    first.join(60)
    later = leave_upload(s3_server, flyte_uri(bucket, 0))
    assert discard_before(bucket, 1, options) is None
    assert uploads_at(s3_server, flyte_uri(bucket, 0)) == [later]


def test_no_clean_up_starts_without_earlier_attempts_or_on_local_disk(
    bucket: str, options: dict[str, Any], tmp_path: Path
) -> None:
    s3_backend = backend_for(f"s3://{bucket}/no/attempts/checkpoint", options)
    assert (
        discard_earlier_uploads(
            s3_backend, f"s3://{bucket}/no/attempts/checkpoint", run_name=RUN, action_name=ACTION
        )
        is None
    )
    local = str(tmp_path / RUN / ACTION / "3" / "checkpoint")
    assert discard_earlier_uploads(backend_for(local), local, run_name=RUN, action_name=ACTION) is None
