"""This package's transfer settings, typed (``transfer=TransferSettings(...)``) and in the older
spelling inside ``storage_options``: the same behaviour on local disk and on a real S3 server,
clear errors for a misspelt or invalid setting, and a setting given both ways refused."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import flyte_checkpoint
from flyte_checkpoint import Checkpoint, ConfigurationError, TransferSettings
from flyte_checkpoint.state import CheckpointManager, StateCheckpoint
from flyte_checkpoint.storage import backend_for
from flyte_checkpoint.storage.stores.local import LocalBackend
from tests.state.workers import Unit
from tests.storage.conftest import Remote, remote_for
from tests.storage_servers import StorageServer

MiB = 1 << 20


@pytest.fixture
def s3(s3_server: StorageServer) -> Remote:
    return remote_for("s3", s3_server)


# -- the value object ----------------------------------------------------------------------------


def test_the_settings_are_exported_frozen_and_picklable() -> None:
    assert flyte_checkpoint.TransferSettings is TransferSettings
    assert "TransferSettings" in flyte_checkpoint.__all__
    settings = TransferSettings(part_size=16 * MiB, fsync=True)
    with pytest.raises(ValueError, match="frozen"):
        settings.part_size = MiB
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_a_misspelt_setting_names_itself_the_closest_setting_and_every_accepted_one() -> None:
    with pytest.raises(ConfigurationError) as refused:
        TransferSettings(part_sise=16 * MiB)  # type: ignore[call-arg]
    message = str(refused.value)
    assert "'part_sise'" in message
    assert "did you mean 'part_size'" in message
    for name in ("max_concurrency", "file_concurrency", "part_attempts", "transfer_timeout", "fsync"):
        assert name in message


@pytest.mark.parametrize(
    ("name", "value"),
    [("part_size", 1000), ("max_concurrency", 0), ("transfer_timeout", -1), ("fsync", "yes")],
)
def test_an_invalid_setting_names_itself_and_its_value(name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"transfer setting '{name}'={value!r}"):
        TransferSettings(**{name: value})  # type: ignore[arg-type]


# -- local disk ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("storage_options", "transfer"),
    [({"fsync": True}, None), (None, TransferSettings(fsync=True))],
    ids=["storage-option", "typed"],
)
def test_both_spellings_make_local_writes_durable(
    storage_options: dict[str, Any] | None, transfer: TransferSettings | None, tmp_path: Path
) -> None:
    backend = backend_for(str(tmp_path / "ckpt"), storage_options, transfer=transfer)
    assert isinstance(backend, LocalBackend)
    assert backend.fsync is True
    Checkpoint(tmp_path / "ckpt", storage_options=storage_options, transfer=transfer).save_sync(b"state")
    restored = Checkpoint(
        tmp_path / "out", tmp_path / "ckpt", storage_options=storage_options, transfer=transfer
    ).load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"state"


def test_without_fsync_in_the_typed_settings_the_environment_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_CHECKPOINT_FSYNC", "1")
    backend = backend_for(str(tmp_path / "ckpt"), transfer=TransferSettings(part_size=16 * MiB))
    assert isinstance(backend, LocalBackend)
    assert backend.fsync is True


def test_both_spellings_refuse_the_same_invalid_value_on_local_disk(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"storage option 'part_size'=1000"):
        Checkpoint(tmp_path / "ckpt", storage_options={"part_size": 1000})
    with pytest.raises(ConfigurationError, match=r"transfer setting 'part_size'=1000"):
        Checkpoint(tmp_path / "ckpt", transfer=TransferSettings(part_size=1000))


@pytest.mark.parametrize("name", ["part_size", "transfer_timeout", "fsync"])
def test_a_setting_given_both_ways_is_refused_on_local_disk(name: str, tmp_path: Path) -> None:
    given = {"part_size": 16 * MiB, "transfer_timeout": 30.0, "fsync": True}[name]
    with pytest.raises(ConfigurationError, match=rf"'{name}' given both in storage_options and as transfer="):
        Checkpoint(tmp_path / "ckpt", storage_options={name: given}, transfer=TransferSettings())


def test_the_state_managers_take_the_typed_settings_to_every_step(tmp_path: Path) -> None:
    transfer = TransferSettings(fsync=True)
    manager = CheckpointManager(tmp_path / "steps", keep_last=2, transfer=transfer)
    manager.save(1, controller=Unit({0: 7}), parts=[])
    step = manager.at(1)
    assert step.transfer == transfer
    copied = pickle.loads(pickle.dumps(step))
    assert isinstance(copied, StateCheckpoint)
    assert copied.transfer == transfer
    target = Unit()
    manager.load(controller=target, parts=[])
    assert target.data == {0: 7}


def test_the_task_context_gives_the_typed_settings_to_its_helper(tmp_path: Path) -> None:
    paths = flyte_checkpoint.CheckpointPaths(checkpoint_path=str(tmp_path / "ckpt"))
    context = flyte_checkpoint.TaskContext(checkpoint_paths=paths, transfer=TransferSettings(fsync=True))
    helper = context.checkpoint
    assert helper is not None
    helper.save_sync(b"state")
    assert (tmp_path / "ckpt").read_bytes() != b""


# -- a real S3 server ----------------------------------------------------------------------------


def multipart_parts(remote: Remote, key: str) -> int:
    """How many parts the object at ``key`` was uploaded in (S3's ETag says: ``"...-N"``)."""
    info = backend_for(remote.uri(key), remote.storage_options).info(remote.uri(key))
    assert info is not None
    assert info.version is not None
    etag = info.version.strip('"')
    return int(etag.rpartition("-")[2]) if "-" in etag else 1


def test_both_spellings_give_s3_the_same_parts(s3: Remote) -> None:
    data = os.urandom(12 * MiB)
    old = {**s3.storage_options, "part_size": 5 * MiB, "max_concurrency": 2}
    Checkpoint(s3.uri("old"), storage_options=old).save_sync(data)
    typed = TransferSettings(part_size=5 * MiB, max_concurrency=2)
    Checkpoint(s3.uri("typed"), storage_options=s3.storage_options, transfer=typed).save_sync(data)
    Checkpoint(s3.uri("default"), storage_options=s3.storage_options).save_sync(data)
    assert multipart_parts(s3, "old") == multipart_parts(s3, "typed") == 3
    assert multipart_parts(s3, "default") == 2
    for key in ("old", "typed"):
        backend = backend_for(s3.uri(key), s3.storage_options, transfer=typed)
        reader = backend.open_read(s3.uri(key))
        assert reader is not None
        with reader:
            assert reader.read() == data


def test_with_typed_settings_the_storage_options_reach_s3_as_given(s3: Remote) -> None:
    typed = TransferSettings(part_size=5 * MiB, max_concurrency=2, transfer_timeout=60.0)
    backend = backend_for(s3.uri("k"), s3.storage_options, transfer=typed)
    assert backend.transfer == typed  # type: ignore[attr-defined]
    old = backend_for(
        s3.uri("k"),
        {**s3.storage_options, "part_size": 5 * MiB, "max_concurrency": 2, "transfer_timeout": 60.0},
    )
    assert old.transfer == typed  # type: ignore[attr-defined]


def test_a_setting_given_both_ways_is_refused_on_s3(s3: Remote) -> None:
    with pytest.raises(
        ConfigurationError, match=r"'part_size' given both in storage_options and as transfer="
    ):
        Checkpoint(
            s3.uri("k"),
            storage_options={**s3.storage_options, "part_size": 5 * MiB},
            transfer=TransferSettings(part_size=5 * MiB),
        )
