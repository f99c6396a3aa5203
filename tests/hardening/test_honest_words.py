"""What the package says about its own objects is true: verify of our own streamed S3 directory
archive does not call it another tool's, and a restore out of space names what was loaded."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.single.inspection import inspect_object
from tests.storage_servers import StorageServer, create_bucket

MiB = 1 << 20


def test_verify_of_our_own_multipart_directory_archive_says_what_was_and_was_not_recorded(
    tmp_path: Path, s3_server: StorageServer
) -> None:
    source = tmp_path / "model"
    source.mkdir()
    for index in range(3):
        (source / f"shard-{index}.bin").write_bytes(os.urandom(4 * MiB))
    options = {**s3_server.storage_options, "part_size": 5 * MiB}
    uri = f"s3://{create_bucket(s3_server)}/ckpt"
    Checkpoint(uri, storage_options=options).save_sync(source)
    report = inspect_object(uri, storage_options=options, verify=True)
    assert report.verified
    assert report.recorded_format == "archive"
    assert report.not_checked is not None
    (unchecked,) = report.not_checked
    assert "this package wrote it as a directory archive" in unchecked
    assert "another tool" not in unchecked


def test_verify_of_an_object_another_tool_wrote_says_so(tmp_path: Path, s3_server: StorageServer) -> None:
    bucket = create_bucket(s3_server)
    s3_server.filesystem().pipe(f"{bucket}/ckpt", b"written by another tool")
    report = inspect_object(f"s3://{bucket}/ckpt", storage_options=s3_server.storage_options, verify=True)
    assert report.not_checked is not None
    (unchecked,) = report.not_checked
    assert "another tool wrote it" in unchecked


def test_a_restore_out_of_space_names_the_checkpoint_and_tmpdir_not_save_again(tmp_path: Path) -> None:
    import subprocess
    import sys

    source = tmp_path / "ckpt"
    Checkpoint(source).save_sync(os.urandom(4 * MiB))
    program = (
        "import resource, signal, sys\n"
        "from flyte_checkpoint import Checkpoint, CheckpointStorageError\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"  # a full disk past 1 MiB
        "try:\n"
        "    Checkpoint(sys.argv[1] + '.unused', sys.argv[1]).load_sync()\n"
        "except CheckpointStorageError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(3)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, "-c", program, str(source)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"restoring {source}" in result.stdout
    assert f"TMPDIR ({tmp_path})" in result.stdout
    assert "save again" not in result.stdout
    assert "load again" in result.stdout


def test_a_multi_part_save_and_load_each_log_one_line_like_a_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from flyte_checkpoint.state import CheckpointManager

    class Part:
        def __init__(self, data: bytes = b"") -> None:
            self.data = data

        def state_dict(self) -> dict[str, bytes]:
            return {"data": self.data}

        def load_state_dict(self, state: dict[str, bytes]) -> None:
            self.data = state["data"]

    manager = CheckpointManager(tmp_path / "steps")
    with caplog.at_level(logging.INFO, logger="flyte_checkpoint"):
        manager.save(3, controller=Part(b"c"), parts=[Part(os.urandom(MiB)), Part(b"x")])
        manager.load(controller=Part(), parts=[Part(), Part()])
    lines = [record.getMessage() for record in caplog.records if record.name == "flyte_checkpoint"]
    saved = [line for line in lines if line.startswith("saved ")]
    loaded = [line for line in lines if line.startswith("loaded ")]
    assert len(saved) == 1
    assert len(loaded) == 1
    for line in (saved[0], loaded[0]):
        assert str(tmp_path / "steps" / "step_3") in line
        assert "(2 parts and a controller): 1.0 MiB in " in line
        assert "MiB/s" in line


def test_a_multi_part_save_and_load_report_progress_over_all_parts(tmp_path: Path) -> None:
    from flyte_checkpoint.state import CheckpointManager

    class Part:
        def __init__(self, data: bytes = b"") -> None:
            self.data = data

        def state_dict(self) -> bytes:
            return self.data

        def load_state_dict(self, state: bytes) -> None:
            self.data = state

    saved: list[tuple[int, int | None]] = []
    loaded: list[tuple[int, int | None]] = []
    manager = CheckpointManager(tmp_path / "steps")
    parts = [Part(os.urandom(3 * MiB)), Part(os.urandom(2 * MiB))]
    manager.save(1, controller=None, parts=parts, progress=lambda done, total: saved.append((done, total)))
    manager.load(
        controller=None, parts=[Part(), Part()], progress=lambda done, total: loaded.append((done, total))
    )
    for told in (saved, loaded):
        assert told, "no progress was reported"
        done = [count for count, _ in told]
        assert done == sorted(done)
        total = told[-1][1]
        assert total is not None
        assert total > 5 * MiB  # both parts (each pickled a little larger than its bytes)
        assert done[-1] == total


def test_a_dcp_save_and_load_each_log_one_line_like_a_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    from flyte_checkpoint.distributed import DistributedCheckpointManager

    manager = DistributedCheckpointManager(tmp_path / "dcp")
    with caplog.at_level(logging.INFO, logger="flyte_checkpoint"):
        manager.save(3, {"weights": torch.ones(1024, 256)})
        manager.load({"weights": torch.zeros(1024, 256)})
    lines = [record.getMessage() for record in caplog.records if record.name == "flyte_checkpoint"]
    saved = [line for line in lines if line.startswith(f"saved {tmp_path / 'dcp' / 'step_3'} DCP version")]
    loaded = [
        line for line in lines if line.startswith(f"loaded {tmp_path / 'dcp' / 'step_3'} into this rank")
    ]
    assert len(saved) == len(loaded) == 1
    assert all("1.0 MiB in " in line and "MiB/s" in line for line in (*saved, *loaded))
