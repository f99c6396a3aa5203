"""A directory of zeros (a preallocated buffer) that this package saved loads with the default
limits, and verify agrees with load; an archive without our record is still refused as a bomb."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    ArchiveLimitError,
    Checkpoint,
    ConfigurationError,
    current_checkpoint,
    run_with_retries,
)
from flyte_checkpoint.archive.limits import MAX_EXPANSION_RATIO_ENV, ExtractionLimits
from flyte_checkpoint.single.inspection import inspect_object
from tests.storage_servers import StorageServer, create_bucket

MiB = 1 << 20
ZEROS = 300 * MiB  # past the 256 MiB after which the expansion ratio is checked


def preallocated(root: Path) -> Path:
    root.mkdir()
    with open(root / "buffer.bin", "wb") as buffer:
        buffer.truncate(ZEROS)  # sparse: zeros that cost no disk here
    (root / "config.json").write_text('{"step": 7}')
    return root


def zeros_archive_of_another_tool() -> bytes:
    """The same tree as ``tar czf`` would make it: no record of ours with it."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz", compresslevel=1) as archive:
        info = tarfile.TarInfo("buffer.bin")
        info.size = ZEROS
        archive.addfile(info, io.BytesIO(bytes(ZEROS)))
    return packed.getvalue()


def location(
    where: str, name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, dict[str, Any] | None]:
    """``name`` on local disk or in a fresh bucket of the S3 server, with its storage options."""
    if where == "local":
        return str(tmp_path / name), None
    server: StorageServer = request.getfixturevalue("s3_server")
    return f"s3://{create_bucket(server)}/{name}", server.storage_options


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_zero_heavy_directory_we_saved_loads_with_the_default_limits_and_verifies(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    uri, options = location(where, "ckpt", tmp_path, request)
    Checkpoint(uri, storage_options=options).save_sync(preallocated(tmp_path / "model"))
    assert inspect_object(uri, storage_options=options, verify=True).verified
    with Checkpoint(tmp_path / "unused", uri, storage_options=options) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert (restored / "buffer.bin").stat().st_size == ZEROS
        assert (restored / "config.json").read_text() == '{"step": 7}'


def test_a_zeros_archive_without_our_record_is_refused_by_load_and_verify_alike(tmp_path: Path) -> None:
    hostile = tmp_path / "ckpt"
    hostile.write_bytes(zeros_archive_of_another_tool())
    with pytest.raises(ArchiveLimitError, match="decompression bomb"):
        inspect_object(str(hostile), verify=True)
    with (
        pytest.raises(ArchiveLimitError, match=MAX_EXPANSION_RATIO_ENV),
        Checkpoint(tmp_path / "unused", hostile) as helper,
    ):
        helper.load_sync()


def test_the_expansion_limit_can_be_lifted_for_every_load_through_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = tmp_path / "ckpt"
    hostile.write_bytes(zeros_archive_of_another_tool())
    monkeypatch.setenv(MAX_EXPANSION_RATIO_ENV, "none")
    with Checkpoint(tmp_path / "unused", hostile) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert (restored / "buffer.bin").stat().st_size == ZEROS


def test_our_record_bounds_the_content_an_archive_may_unpack_to() -> None:
    limits = ExtractionLimits().for_recorded(1000)
    assert limits.max_expansion_ratio is None
    assert limits.max_total_bytes == 1000


@pytest.mark.parametrize("raw", ["lots", "0.5", "-3"])
def test_a_malformed_limit_in_the_environment_is_a_configuration_error(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_EXPANSION_RATIO_ENV, raw)
    with pytest.raises(ConfigurationError, match=MAX_EXPANSION_RATIO_ENV):
        ExtractionLimits()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_zero_heavy_directory_saved_by_a_task_loads_on_its_retry(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_dir, options = location(where, "run", tmp_path, request)
    model = preallocated(tmp_path / "model")
    restored_sizes: list[int] = []

    def task() -> None:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        if restored is None:
            checkpoint.save_sync(model)
            raise RuntimeError("the first attempt fails after saving")
        restored_sizes.append((restored / "buffer.bin").stat().st_size)

    run_with_retries(task, retries=1, checkpoint_dir=run_dir, storage_options=options)
    assert restored_sizes == [ZEROS]
