"""Shared fixtures: temporary checkpoint locations and a clean task environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flyte_checkpoint.environment import ATTEMPT_NUMBER_ENV
from tests.storage_servers import StorageServer, start_azurite, start_fake_gcs, start_moto
from tests.stores import STORE_KINDS, Store, store_of


def _serve(start: Callable[..., StorageServer], log_dir: Path) -> Iterator[StorageServer]:
    # No skip: a server that cannot start fails the tests that need it, with its log tail.
    server = start(log_dir=log_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageServer]:
    """A real S3 server (moto) on 127.0.0.1 for the whole session."""
    yield from _serve(start_moto, tmp_path_factory.mktemp("moto-log"))


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageServer]:
    """A real GCS emulator (fake-gcs-server) on 127.0.0.1 for the whole session."""
    yield from _serve(start_fake_gcs, tmp_path_factory.mktemp("gcs-log"))


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StorageServer]:
    """A real Azure Blob emulator (Azurite) on 127.0.0.1 for the whole session."""
    yield from _serve(start_azurite, tmp_path_factory.mktemp("azurite-log"))


@pytest.fixture(params=STORE_KINDS)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each test using it runs on local disk, S3 (moto), GCS (fake-gcs-server) and Azure
    (Azurite): the shared "every store" parametrisation (``tests/state`` keeps its own)."""
    return store_of(str(request.param), request, tmp_path)


@pytest.fixture(autouse=True)
def no_inherited_attempt_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start outside any task attempt, whatever the shell running them has set."""
    monkeypatch.delenv(ATTEMPT_NUMBER_ENV, raising=False)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small directory shaped like a model checkpoint: weights, config, nested shards."""
    root = tmp_path / "model"
    (root / "shards" / "rank0").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "config.json").write_text('{"layers": 4, "name": "tiny"}')
    (root / "weights.bin").write_bytes(os.urandom(300_000))
    (root / "shards" / "rank0" / "part-0.bin").write_bytes(os.urandom(70_000))
    (root / "shards" / "notes with spaces é.txt").write_text("résumé\n" * 100)
    (root / "zero-bytes").write_bytes(b"")
    return root


def tree_of(root: Path) -> dict[str, bytes | None]:
    """Relative path -> file content (``None`` for directories), for comparing restored trees."""
    return {
        path.relative_to(root).as_posix(): (None if path.is_dir() else path.read_bytes())
        for path in sorted(root.rglob("*"))
    }


def damage_in_place(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes of a stored object the way bit rot does: its modification time unchanged."""
    status = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def truncate_in_place(path: Path, length: int) -> None:
    """Cut a stored object short, as a failing disk would: its modification time unchanged."""
    status = path.stat()
    os.truncate(path, length)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
