"""A background save in flight when the program ends, or when Ctrl-C ends it, is finished before
the interpreter exits (on every store), and an interrupt is never retried as a storage failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import CheckpointStorageError
from flyte_checkpoint.storage.errors import to_checkpoint_error
from tests.faults.signals.processes import running
from tests.faults.signals.test_interrupted_saves import location

SIZE_MIB = 48


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_background_save_in_flight_when_the_script_ends_is_committed(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dest, options = location(where, tmp_path, request)
    with running(["background-then-end", str(SIZE_MIB), dest], storage_options=options) as program:
        status = program.finish()
    assert status == 0, program.output()
    assert "waiting for the background save" in program.output()
    with Checkpoint(tmp_path / "unused", dest, storage_options=options) as restored:
        loaded = restored.load_sync()
        assert loaded is not None
        assert loaded.stat().st_size == SIZE_MIB << 20


@pytest.mark.parametrize("where", ["local", "s3"])
def test_ctrl_c_during_a_background_save_lets_it_commit_without_retries(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dest, options = location(where, tmp_path, request)
    argv = ["background-then-end", str(SIZE_MIB), dest, "--interrupt-after", "0.05"]
    with running(argv, storage_options=options) as program:
        status = program.finish()
    assert status != 0  # the KeyboardInterrupt ends the script
    assert "KeyboardInterrupt" in program.output()
    assert " retry " not in program.output()
    with Checkpoint(tmp_path / "unused", dest, storage_options=options) as restored:
        loaded = restored.load_sync()
        assert loaded is not None
        assert loaded.stat().st_size == SIZE_MIB << 20


def test_a_thread_pool_refusing_work_at_interpreter_exit_is_not_a_transient_storage_error() -> None:
    try:
        try:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        except RuntimeError as refused:
            raise OSError("An HTTP Client raised an unhandled exception") from refused
    except OSError as wrapped:
        translated = to_checkpoint_error(wrapped, "s3://bucket/key", "saving", "s3")
    assert type(translated) is CheckpointStorageError
    assert "interpreter is shutting down" in str(translated)
    assert "wait_sync()" in str(translated)
