"""A recorded size that is not a byte count means the object is damaged, not a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, CheckpointCorruptError
from flyte_checkpoint.storage import SIZE_KEY, backend_for
from flyte_checkpoint.storage.stores.local import XATTR_NAME, decode_record, encode_record
from tests.storage.conftest import Remote


def _rewrite_recorded_size(path: Path, size: str) -> None:
    record = decode_record(os.getxattr(path, XATTR_NAME))
    os.setxattr(path, XATTR_NAME, encode_record({**record, SIZE_KEY: size}))


@pytest.mark.parametrize("size", ["12x", "-3", "1e3"])
def test_a_local_object_whose_recorded_size_is_not_a_count_loads_as_corrupt_naming_it(
    tmp_path: Path, size: str
) -> None:
    target = tmp_path / "ckpt"
    Checkpoint(target).save_sync(b"some checkpoint bytes")
    _rewrite_recorded_size(target, size)
    with pytest.raises(
        CheckpointCorruptError, match=rf"{target}.*recorded size '{size}' is not a byte count"
    ):
        Checkpoint(tmp_path / "unused", target).load_sync()


def test_a_local_empty_object_whose_recorded_size_is_not_a_count_is_corrupt(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    Checkpoint(target).save_sync(b"x")
    stamp = os.stat(target).st_mtime_ns
    with open(target, "r+b") as handle:
        handle.truncate(0)
    os.utime(target, ns=(stamp, stamp))  # keep the record current: only the size is damaged
    _rewrite_recorded_size(target, "many")
    with pytest.raises(CheckpointCorruptError, match="recorded size 'many'"):
        Checkpoint(tmp_path / "unused", target).load_sync()


def test_an_s3_object_whose_recorded_size_is_not_a_count_loads_as_corrupt_naming_it(
    s3_remote: Remote,
) -> None:
    remote = s3_remote
    uri = remote.uri("bad-size")
    Checkpoint(uri, storage_options=remote.storage_options).save_sync(b"original bytes")
    info = backend_for(uri, remote.storage_options).info(uri)
    assert info is not None
    with remote.server.filesystem().open(uri, "wb", Metadata={**info.metadata, SIZE_KEY: "fourteen"}) as out:
        out.write(b"original bytes")
    with pytest.raises(CheckpointCorruptError, match=r"bad-size.*recorded size 'fourteen'"):
        Checkpoint("/tmp/unused", uri, storage_options=remote.storage_options).load_sync()


@pytest.fixture
def s3_remote(request: pytest.FixtureRequest) -> Remote:
    from tests.storage.conftest import remote_for

    return remote_for("s3", request.getfixturevalue("s3_server"))
