"""Fixtures for the multi-part checkpoint tests: a place to store (local disk or a real S3 server),
and a guard that no process or thread outlives a test."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.storage_servers import StorageServer, create_bucket
from tests.stores import Store, clear_launcher_variables

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(autouse=True)
def outside_any_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start as rank 0 of 1, whatever launcher variables the shell running them has set."""
    clear_launcher_variables(monkeypatch)


def _local(tmp_path: Path) -> Store:
    return Store("local", str(tmp_path / "checkpoints"))


_SCHEME = {"s3": "s3", "gcs": "gs", "azure": "abfs"}


def _remote(kind: str, server: StorageServer) -> Store:
    bucket = create_bucket(server, "state")
    return Store(kind, f"{_SCHEME[kind]}://{bucket}/checkpoints", server.storage_options)


def _s3(server: StorageServer) -> Store:
    return _remote("s3", server)


def _store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    kind = str(request.param)
    if kind == "local":
        return _local(tmp_path)
    return _remote(kind, request.getfixturevalue(f"{kind}_server"))


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs once on local disk and once on S3."""
    return _store(request, tmp_path)


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """For the core protocol tests: each runs on local disk, S3 (moto), GCS (fake-gcs-server)
    and Azure (Azurite)."""
    return _store(request, tmp_path)


@pytest.fixture
def local_store(tmp_path: Path) -> Store:
    return _local(tmp_path)


@pytest.fixture
def s3_store(s3_server: StorageServer) -> Store:
    return _s3(s3_server)


# Threads that legitimately live for the whole process: fsspec's event-loop thread (s3fs), the
# executor threads of that loop (daemon, named asyncio_N), the helper threads of multiprocessing
# queues, which exit once their queue is collected, and the storage layer's reaper, started by
# the first local save that replaces an object (flyte_checkpoint.storage.deferred_unlink; one per process,
# it unlinks the replaced object's second name off the saving thread), and gcsfs's one thread
# that closes files handed to it.
_PROCESS_WIDE_THREADS = ("fsspecIO", "QueueFeederThread", "flyte-checkpoint-reaper", "gcsfs-deferred-close")


def _process_wide(thread: threading.Thread) -> bool:
    return thread.name.startswith(_PROCESS_WIDE_THREADS) or (
        thread.daemon and thread.name.startswith("asyncio_")
    )


@pytest.fixture(autouse=True)
def nothing_outlives_the_test() -> Iterator[None]:
    """Fail a test that leaves a child process or a thread of ours running."""
    threads_before = set(threading.enumerate())
    yield
    leftover_processes = multiprocessing.active_children()
    for process in leftover_processes:
        process.kill()
        process.join(5)
    deadline = time.monotonic() + 5
    while True:
        leftover_threads = [
            thread
            for thread in set(threading.enumerate()) - threads_before
            if thread.is_alive() and not _process_wide(thread)
        ]
        if not leftover_threads or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not leftover_processes, f"processes outlived the test: {leftover_processes}"
    assert not leftover_threads, f"threads outlived the test: {leftover_threads}"
