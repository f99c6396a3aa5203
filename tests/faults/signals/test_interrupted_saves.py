"""A save interrupted at any instant unwinds promptly and keeps the previous object; a background
save in flight when the program ends is finished, on local disk and on an S3 server."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from tests.faults.signals.processes import running
from tests.storage_servers import StorageServer, create_bucket

MiB = 1 << 20
TRIALS = 4


def make_tree(root: Path, files: int, size: int) -> Path:
    """Random files (so compression takes as long as it can), each ``size`` bytes."""
    root.mkdir()
    for index in range(files):
        (root / f"part-{index}.bin").write_bytes(os.urandom(size))
    return root


def location(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any] | None]:
    if where == "local":
        return str(tmp_path / "checkpoint.tar.gz"), None
    server: StorageServer = request.getfixturevalue("s3_server")
    return f"s3://{create_bucket(server)}/checkpoint", server.storage_options


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize(
    ("signum", "extra"),
    [(signal.SIGINT, []), (signal.SIGTERM, ["--exit-on-sigterm"])],
    ids=["ctrl-c", "sigterm-handler-calling-sys-exit"],
)
def test_a_directory_save_interrupted_at_a_random_instant_ends_and_keeps_the_previous_object(
    where: str, signum: int, extra: list[str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = make_tree(tmp_path / "model", files=6, size=8 * MiB)
    dest, options = location(where, tmp_path, request)
    Checkpoint(dest, storage_options=options).save_sync(b"previous")
    rng = random.Random(f"{where}-{signum}")
    for _ in range(TRIALS):
        with running(["save-dir", str(source), dest, *extra], storage_options=options) as program:
            program.wait_for_line("ready")
            time.sleep(rng.uniform(0.0, 0.4))
            program.send(signum)
            status = program.finish()
        said_committed = "committed" in program.output().splitlines()
        assert said_committed or status != 0, program.output()
        restored = Checkpoint(tmp_path / "restore", dest, storage_options=options)
        with restored:
            loaded = restored.load_sync()
            assert loaded is not None
            # The old object or the whole new one: the save may commit just before the signal
            # lands, ahead of the program saying so.
            committed = loaded == restored.path
            assert committed or not said_committed
            if committed:
                assert sorted(p.name for p in loaded.iterdir()) == sorted(p.name for p in source.iterdir())
            else:
                assert loaded.read_bytes() == b"previous"
        if where == "local":  # the aborted upload's temporary file is gone too
            assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.tar.gz", "model"]
        if committed:  # the signal came too late: start the next trial from the previous object again
            Checkpoint(dest, storage_options=options).save_sync(b"previous")
