"""The state package reaches storage only through the backend, with the caller's storage options:
``fsync`` reaches local disk, and each stored byte is digested once per load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyte_checkpoint.state import StateCheckpoint
from flyte_checkpoint.state.layout import MANIFEST_NAME, Layout
from flyte_checkpoint.storage import FSYNC_ENV
from flyte_checkpoint.storage.digests import ContentDigest
from tests.state.workers import Controller, Unit


@pytest.fixture
def fsync_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``os.fsync`` of this process while the test runs (observed, then really done)."""
    monkeypatch.delenv(FSYNC_ENV, raising=False)
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    return calls


def save_two_parts(checkpoint_dir: Path, storage_options: dict[str, bool] | None) -> None:
    StateCheckpoint(checkpoint_dir, storage_options=storage_options).save(
        controller=Controller({1}), parts=[Unit({0: "a"}), Unit({1: "b"})], metadata={"step": 1}
    )


def test_the_fsync_storage_option_makes_a_local_save_sync_every_object_it_writes(
    tmp_path: Path, fsync_calls: list[int]
) -> None:
    save_two_parts(tmp_path / "ckpt", {"fsync": True})
    # Controller, 2 parts, metadata.json, manifest.json, the pointer: each file, then its directory.
    assert len(fsync_calls) >= 2 * 6


def test_a_local_save_without_the_fsync_option_syncs_nothing(tmp_path: Path, fsync_calls: list[int]) -> None:
    save_two_parts(tmp_path / "ckpt", None)
    assert fsync_calls == []


def test_a_load_digests_each_stored_byte_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = StateCheckpoint(tmp_path / "ckpt")
    manifest = checkpoint.save(
        controller=None, parts=[Unit({0: os.urandom(200_000)}), Unit({1: os.urandom(300_000)})]
    )
    layout = Layout.of(tmp_path / "ckpt")
    parts = sum(part.size for part in manifest.parts)
    records = sum(
        info.size
        for uri in (layout.pointer_uri, layout.object_uri(manifest.version_id, MANIFEST_NAME))
        if (info := layout.backend.info(uri)) is not None
    )
    digested: list[int] = []
    real_update = ContentDigest.update

    def counting_update(self: ContentDigest, data: bytes | bytearray | memoryview) -> None:
        digested.append(len(data))
        real_update(self, data)

    monkeypatch.setattr(ContentDigest, "update", counting_update)
    checkpoint.load(controller=None, parts=[Unit(), Unit()])
    # The parts once each, plus at most the pointer and the manifest (where their digest was recorded).
    assert parts <= sum(digested) <= parts + records


def test_a_version_holding_only_a_killed_writers_temp_file_is_collected_by_the_next_save(
    tmp_path: Path,
) -> None:
    checkpoint = StateCheckpoint(tmp_path / "ckpt")
    checkpoint.save(controller=None, parts=[Unit({0: "first"})])
    abandoned = tmp_path / "ckpt" / "versions" / "20260101T000000000000Z-abandoned"
    abandoned.mkdir()
    (abandoned / ".part-00000.bin.0123456789abcdef.fc-tmp").write_bytes(b"half a part")

    saved = checkpoint.save(controller=None, parts=[Unit({0: "second"})])

    assert sorted(path.name for path in (tmp_path / "ckpt" / "versions").iterdir()) == [saved.version_id]
