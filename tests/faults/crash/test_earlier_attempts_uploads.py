"""The next attempt removes what a SIGKILLed attempt's save left unfinished on the store.

Method. A worker process (the crash tests' zygote, ``tests.faults.crash.workers save``) saves a 20 MiB
file as attempt 1 of a run (``…/{run}/{action}/1/checkpoint``), one part at a time, and is
SIGKILLed as soon as the store has acknowledged its first part: on S3 an incomplete multipart
upload stays on that key, on GCS the temporary part objects under ``<key>.fc-parts/``. No later
save goes to that key, so no save's stale-upload sweep ever meets them. Then another worker
starts attempt 2 (``load`` of the previous checkpoint with its destination at
``…/2/checkpoint`` and the run's names) and lives on after its load, as a task does: its
background clean-up must remove what attempt 1 left, and nothing of the uploads in progress
beside it (another action's attempt, this attempt's own key, a key that only starts like the
dead attempt's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fsspec.asyn import sync

from tests.faults.crash.harness import MiB, Zygote, write_random_file
from tests.storage_servers import StorageServer, create_bucket

RUN, ACTION = "r7x2", "a0"
CLEANED_WITHIN = 60.0
"""Seconds the next attempt may take to remove the leftovers (a bound for a loaded machine, not
a speed requirement)."""


@dataclass
class Store:
    """One bucket of a real server and how its unfinished uploads show."""

    scheme: str
    bucket: str
    fs: Any
    options: dict[str, Any]
    unfinished: Callable[[str], list[str]]
    """What is left unfinished at a key: upload ids (S3) or temporary object names (GCS)."""
    start_another: Callable[[str], None]
    """Start an upload to a key the way a live writer does (and leave it unfinished)."""
    preload: tuple[str, ...]

    def uri(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"


def _s3(server: StorageServer) -> Store:
    bucket = create_bucket(server, "earlier")
    fs = server.filesystem()

    def call(operation: str, **params: Any) -> Any:
        return sync(fs.loop, fs._call_s3, operation, Bucket=bucket, **params)

    def unfinished(key: str) -> list[str]:
        page = call("list_multipart_uploads", Prefix=key)
        return [str(upload["UploadId"]) for upload in page.get("Uploads", []) if upload["Key"] == key]

    def start_another(key: str) -> None:
        upload_id = call("create_multipart_upload", Key=key)["UploadId"]
        call("upload_part", Key=key, UploadId=upload_id, PartNumber=1, Body=b"p" * 1024)

    preload = ("flyte_checkpoint.storage.stores.s3", "s3fs")
    return Store("s3", bucket, fs, server.storage_options, unfinished, start_another, preload)


def _gcs(server: StorageServer) -> Store:
    bucket = create_bucket(server, "earlier")
    fs = server.filesystem()

    def unfinished(key: str) -> list[str]:
        fs.invalidate_cache()
        try:
            return sorted(fs.find(f"{bucket}/{key}.fc-parts/"))
        except FileNotFoundError:
            return []

    def start_another(key: str) -> None:
        fs.pipe_file(f"{bucket}/{key}.fc-parts/{uuid.uuid4().hex}/00001", b"p" * 1024)

    preload = ("flyte_checkpoint.storage.stores.gcs", "gcsfs")
    return Store("gs", bucket, fs, server.storage_options, unfinished, start_another, preload)


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> Store:
    if request.param == "s3":
        return _s3(request.getfixturevalue("s3_server"))
    return _gcs(request.getfixturevalue("gcs_server"))


def _attempt_key(attempt: int, action: str = ACTION) -> str:
    return f"runs/{RUN}/{action}/{attempt}/checkpoint"


def _options(store: Store) -> dict[str, Any]:
    # One 5 MiB part at a time: the first acknowledged part comes well before the last.
    return store.options | {"file_concurrency": 1, "part_size": 5 * MiB}


def _wait_until(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_next_attempt_removes_what_a_killed_attempts_save_left_unfinished(
    store: Store, tmp_path: Path
) -> None:
    source = write_random_file(tmp_path / "state.bin", 20 * MiB, seed=1)
    options = _options(store)
    dead, this = _attempt_key(1), _attempt_key(2)
    with Zygote(tmp_path / "logs", preload=store.preload) as zygote:
        argv = ["save", "--kind", "file", "--source", str(source), "--dest", store.uri(dead)]
        with zygote.spawn(argv, storage_options=options) as attempt:
            attempt.wait_for("progress")  # the store holds a part: the upload is under way
            attempt.kill()
            assert not attempt.seen("committed"), attempt.describe()
        assert store.unfinished(dead), "the kill left nothing unfinished: the test proves nothing"
        beside = [_attempt_key(1, action="a1"), this, f"{dead}-other"]
        for key in beside:
            store.start_another(key)
        before = {key: store.unfinished(key) for key in beside}

        argv = ["load", "--src", store.uri(dead), "--dest", store.uri(this), "--linger", "120"]
        argv += ["--run-name", RUN, "--action-name", ACTION]
        with zygote.spawn(argv, storage_options=options) as next_attempt:
            next_attempt.wait_for("none")  # attempt 1 never committed; attempt 0 never ran
            cleaned = _wait_until(lambda: not store.unfinished(dead), CLEANED_WITHIN)
            assert cleaned, f"still unfinished at {dead}: {store.unfinished(dead)}; {next_attempt.describe()}"
            assert {key: store.unfinished(key) for key in beside} == before
