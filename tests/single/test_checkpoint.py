"""The Checkpoint helper: the spec's load/save semantics on local storage."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import (
    PAYLOAD_BASENAME,
    BaseCheckpoint,
    Checkpoint,
    CheckpointClosedError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
    UnsupportedURIError,
)
from flyte_checkpoint.single.workspace import sweep_abandoned_workspaces
from tests.conftest import tree_of


def saved(tmp_path: Path, data: bytes | Path | str, name: str = "object") -> Path:
    target = tmp_path / name
    Checkpoint(str(target)).save_sync(data)
    return target


def test_checkpoint_is_a_base_checkpoint() -> None:
    assert issubclass(Checkpoint, BaseCheckpoint)


def test_locations_are_exposed_as_given(tmp_path: Path) -> None:
    cp = Checkpoint(f"{tmp_path}/out", f"{tmp_path}/prev")
    assert cp.remote_destination == f"{tmp_path}/out"
    assert cp.remote_source == f"{tmp_path}/prev"
    assert cp.prev_exists()


@pytest.mark.parametrize("src", [None, "", "   ", '""', "' '", ' "" '])
def test_a_missing_or_blank_source_means_no_previous_checkpoint(tmp_path: Path, src: str | None) -> None:
    cp = Checkpoint(str(tmp_path / "out"), src)
    assert cp.remote_source is None
    assert not cp.prev_exists()
    assert cp.load_sync() is None


def test_source_is_stripped_of_whitespace_and_quotes(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path / "out"), f'  "{tmp_path}/prev"\n')
    assert cp.remote_source == f"{tmp_path}/prev"


def test_workspace_has_the_flyte_cp_prefix_and_exists_on_access(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path / "out"))
    assert cp.path.name.startswith("flyte-cp-")
    assert cp.path.is_dir()


def test_bytes_round_trip_into_the_payload_file(tmp_path: Path) -> None:
    source = saved(tmp_path, b"hello-checkpoint")
    cp = Checkpoint(str(tmp_path / "out"), source.as_uri())
    payload_path = cp.load_sync()
    assert payload_path == cp.path / PAYLOAD_BASENAME
    assert payload_path is not None
    assert payload_path.read_bytes() == b"hello-checkpoint"


def test_saved_bytes_are_stored_as_the_object_itself(tmp_path: Path) -> None:
    target = saved(tmp_path, b"next")
    assert target.read_bytes() == b"next"


def test_a_file_is_uploaded_as_is(tmp_path: Path) -> None:
    weights = tmp_path / "training.pt"
    weights.write_bytes(os.urandom(2_000_000))
    target = saved(tmp_path, weights)
    assert target.read_bytes() == weights.read_bytes()


def test_a_file_given_as_a_string_path_is_uploaded_as_is(tmp_path: Path) -> None:
    weights = tmp_path / "state.bin"
    weights.write_bytes(b"abc" * 1000)
    target = saved(tmp_path, str(weights))
    assert target.read_bytes() == weights.read_bytes()


def test_a_file_round_trips_into_the_payload_file(tmp_path: Path) -> None:
    weights = tmp_path / "training.pt"
    weights.write_bytes(os.urandom(500_000))
    cp = Checkpoint("unused", str(saved(tmp_path, weights)))
    restored = cp.load_sync()
    assert restored == cp.path / "payload"
    assert restored is not None
    assert restored.read_bytes() == weights.read_bytes()


def test_a_directory_round_trips_into_the_workspace(tmp_path: Path, model_dir: Path) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, model_dir)))
    restored = cp.load_sync()
    assert restored == cp.path
    assert tree_of(cp.path) == tree_of(model_dir)


def test_a_directory_is_stored_as_a_gzip_tar_of_its_immediate_children(
    tmp_path: Path, model_dir: Path
) -> None:
    target = saved(tmp_path, model_dir)
    with tarfile.open(target, "r:gz") as tar:
        names = set(tar.getnames())
    assert "config.json" in names
    assert "shards/rank0/part-0.bin" in names
    assert not any(name.startswith(("model", "/", "./")) for name in names)


def test_a_tar_gz_written_by_another_tool_is_extracted(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.tar.gz"
    with tarfile.open(foreign, "w:gz") as tar:
        info = tarfile.TarInfo("state/step.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"300"))
    cp = Checkpoint("unused", str(foreign))
    assert cp.load_sync() == cp.path
    assert (cp.path / "state" / "step.txt").read_text() == "300"


def test_a_saved_file_that_is_itself_a_tar_comes_back_as_payload(tmp_path: Path) -> None:
    artefact = tmp_path / "bundle.tar.gz"
    with tarfile.open(artefact, "w:gz") as tar:
        info = tarfile.TarInfo("inside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    cp = Checkpoint("unused", str(saved(tmp_path, artefact)))
    restored = cp.load_sync()
    assert restored == cp.path / "payload"
    assert restored.read_bytes() == artefact.read_bytes()


def test_an_empty_directory_round_trips_as_an_empty_workspace(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cp = Checkpoint("unused", str(saved(tmp_path, empty)))
    assert cp.load_sync() == cp.path
    assert list(cp.path.iterdir()) == []


def test_a_missing_previous_object_loads_as_none(tmp_path: Path) -> None:
    assert Checkpoint("unused", str(tmp_path / "nothing-here")).load_sync() is None


def test_an_empty_previous_object_loads_as_none(tmp_path: Path) -> None:
    empty = tmp_path / "empty-object"
    empty.write_bytes(b"")
    assert Checkpoint("unused", str(empty)).load_sync() is None


def test_first_load_clears_the_workspace(tmp_path: Path) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, b"x")))
    (cp.path / "stale.txt").write_text("left over")
    cp.load_sync()
    assert sorted(p.name for p in cp.path.iterdir()) == ["payload"]


def test_later_loads_return_the_cached_result_without_fetching(tmp_path: Path) -> None:
    source = saved(tmp_path, b"first")
    cp = Checkpoint("unused", str(source))
    first = cp.load_sync()
    source.unlink()
    assert cp.load_sync() == first
    assert first is not None
    assert first.read_bytes() == b"first"


def test_a_none_result_is_cached_too(tmp_path: Path) -> None:
    source = tmp_path / "later"
    cp = Checkpoint("unused", str(source))
    assert cp.load_sync() is None
    source.write_bytes(b"appeared")
    assert cp.load_sync() is None


def test_concurrent_loads_fetch_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, b"shared")))
    calls = []
    original = cp._restore

    def counting_restore(progress: Any) -> Path | None:
        calls.append(1)
        return original(progress)

    monkeypatch.setattr(cp, "_restore", counting_restore)
    results: list[Path | None] = []
    threads = [threading.Thread(target=lambda: results.append(cp.load_sync())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert len(set(results)) == 1


async def test_concurrent_async_loads_fetch_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, b"shared")))
    calls = []
    original = cp._restore

    def counting_restore(progress: Any) -> Path | None:
        calls.append(1)
        return original(progress)

    monkeypatch.setattr(cp, "_restore", counting_restore)
    results = await asyncio.gather(*(cp.load() for _ in range(8)))
    assert len(calls) == 1
    assert len(set(results)) == 1


async def test_async_save_and_load_round_trip(tmp_path: Path, model_dir: Path) -> None:
    target = tmp_path / "async-object"
    await Checkpoint(str(target)).save(model_dir)
    cp = Checkpoint("unused", str(target))
    assert await cp.load() == cp.path
    assert tree_of(cp.path) == tree_of(model_dir)


async def test_async_save_does_not_block_the_event_loop(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    for index in range(4):
        (big / f"shard{index}").write_bytes(os.urandom(8 << 20))
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    ticking = asyncio.create_task(ticker())
    await Checkpoint(str(tmp_path / "obj")).save(big)
    done.set()
    await ticking
    assert ticks > 5


def test_saving_replaces_the_previous_object(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    cp.save_sync(b"one")
    cp.save_sync(b"two")
    assert target.read_bytes() == b"two"


def test_saving_creates_missing_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c" / "checkpoint"
    Checkpoint(str(target)).save_sync(b"deep")
    assert target.read_bytes() == b"deep"


def test_saving_to_a_file_uri_writes_the_local_path(tmp_path: Path) -> None:
    target = tmp_path / "via-uri"
    Checkpoint(target.as_uri()).save_sync(b"uri")
    assert target.read_bytes() == b"uri"


def test_a_save_leaves_no_temporary_files_beside_the_object(tmp_path: Path, model_dir: Path) -> None:
    target = tmp_path / "out" / "obj"
    Checkpoint(str(target)).save_sync(model_dir)
    assert [p.name for p in target.parent.iterdir()] == ["obj"]


def test_saving_a_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError, match="no-such-dir") as caught:
        Checkpoint(str(tmp_path / "obj")).save_sync(missing)
    assert isinstance(caught.value, CheckpointNotFoundError)


@pytest.mark.parametrize("value", [None, 42, 3.5, ["a"], {"a": 1}])
def test_saving_an_unsupported_type_names_the_accepted_types(tmp_path: Path, value: object) -> None:
    with pytest.raises(TypeError, match=r"bytes, a pathlib\.Path or a str path") as caught:
        Checkpoint(str(tmp_path / "obj")).save_sync(value)  # type: ignore[arg-type]
    assert isinstance(caught.value, UnsupportedTypeError)


def test_saving_empty_bytes_is_refused_because_it_would_read_back_as_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="empty"):
        Checkpoint(str(tmp_path / "obj")).save_sync(b"")
    assert not (tmp_path / "obj").exists()


def test_saving_an_empty_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(InvalidCheckpointInputError, match="empty"):
        Checkpoint(str(tmp_path / "obj")).save_sync(empty)


def test_a_failed_save_keeps_the_previous_object(tmp_path: Path) -> None:
    target = tmp_path / "obj"
    cp = Checkpoint(str(target))
    cp.save_sync(b"good")
    with pytest.raises(FileNotFoundError):
        cp.save_sync(tmp_path / "missing")
    assert target.read_bytes() == b"good"


def test_saving_to_a_directory_destination_says_it_must_name_an_object(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    with pytest.raises(CheckpointStorageError, match="is a directory"):
        Checkpoint(str(tmp_path / "adir")).save_sync(b"x")


def test_saving_below_a_file_says_a_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_bytes(b"x")
    with pytest.raises(CheckpointStorageError, match="parent"):
        Checkpoint(str(tmp_path / "afile" / "obj")).save_sync(b"x")


def test_loading_from_a_directory_source_says_it_must_name_an_object(tmp_path: Path) -> None:
    with pytest.raises(CheckpointStorageError, match="is a directory"):
        Checkpoint("unused", str(tmp_path)).load_sync()


def test_an_unsupported_scheme_is_refused_with_the_supported_ones_named(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedURIError, match="s3://"):
        Checkpoint("ftp://host/checkpoint")


def test_an_empty_destination_is_refused() -> None:
    with pytest.raises(InvalidCheckpointInputError, match="checkpoint_dest"):
        Checkpoint("  ")


def test_close_removes_the_workspace(tmp_path: Path) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, b"x")))
    workspace = cp.path
    cp.close()
    assert not workspace.exists()


def test_the_context_manager_closes_the_workspace(tmp_path: Path) -> None:
    with Checkpoint("unused") as cp:
        workspace = cp.path
    assert not workspace.exists()


def test_loading_after_close_is_a_clear_error(tmp_path: Path) -> None:
    cp = Checkpoint("unused", str(saved(tmp_path, b"x")))
    cp.close()
    with pytest.raises(CheckpointClosedError, match="closed"):
        cp.load_sync()


def test_garbage_collection_removes_the_workspace() -> None:
    cp = Checkpoint("unused")
    workspace = Path(str(cp.path))
    del cp
    gc.collect()
    assert not workspace.exists()


def test_a_path_loaded_from_a_temporary_helper_still_exists(tmp_path: Path) -> None:
    restored = Checkpoint("unused", str(saved(tmp_path, b"kept"))).load_sync()
    gc.collect()
    assert restored is not None
    assert restored.read_bytes() == b"kept"


def test_the_workspace_goes_once_the_last_returned_path_is_dropped(tmp_path: Path) -> None:
    restored = Checkpoint("unused", str(saved(tmp_path, b"kept"))).load_sync()
    assert restored is not None
    workspace = Path(str(restored.parent))
    del restored
    gc.collect()
    assert not workspace.exists()


def test_file_save_progress_reports_growing_counts_up_to_the_total(tmp_path: Path) -> None:
    source = tmp_path / "weights.bin"
    source.write_bytes(os.urandom(24 << 20))
    reports: list[tuple[int, int | None]] = []
    Checkpoint(str(tmp_path / "obj")).save_sync(
        source, progress=lambda done, total: reports.append((done, total))
    )
    assert reports[-1] == (24 << 20, 24 << 20)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert len(reports) >= 5


def test_directory_save_progress_has_no_total_but_ends_at_the_object_size(
    tmp_path: Path, model_dir: Path
) -> None:
    reports: list[tuple[int, int | None]] = []
    Checkpoint(str(tmp_path / "obj")).save_sync(model_dir, progress=lambda d, t: reports.append((d, t)))
    assert reports[-1] == ((tmp_path / "obj").stat().st_size, None)


def test_load_progress_ends_at_the_object_size(tmp_path: Path, model_dir: Path) -> None:
    target = saved(tmp_path, model_dir)
    reports: list[tuple[int, int | None]] = []
    Checkpoint("unused", str(target)).load_sync(progress=lambda d, t: reports.append((d, t)))
    size = target.stat().st_size
    assert reports[-1] == (size, size)


def test_each_save_and_load_logs_one_info_line_with_size_and_speed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="flyte_checkpoint")
    target = saved(tmp_path, b"x" * 2048)
    Checkpoint("unused", str(target)).load_sync()
    lines = [r.getMessage() for r in caplog.records if r.name == "flyte_checkpoint"]
    assert any(line.startswith(f"saved {target} bytes: 2.0 KiB in") and "/s)" in line for line in lines)
    assert any(line.startswith(f"loaded {target} into") for line in lines)


def test_a_workspace_abandoned_by_a_killed_process_is_removed_by_the_next_one(tmp_path: Path) -> None:
    script = (
        "import os, signal\n"
        "from flyte_checkpoint import Checkpoint\n"
        "cp = Checkpoint('unused')\n"
        "print(cp.path, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    abandoned = Path(result.stdout.strip())
    assert abandoned.is_dir()
    assert sweep_abandoned_workspaces(str(tmp_path)) == 1
    assert not abandoned.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_live_workspace_is_never_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with Checkpoint("unused") as first:
        workspace = Path(str(first.path))
        assert sweep_abandoned_workspaces(str(tmp_path)) == 0
        with Checkpoint("unused") as second:
            assert Path(str(second.path)) != workspace
            assert workspace.is_dir()
    assert list(tmp_path.iterdir()) == []


async def test_async_with_closes_the_checkpoint_and_removes_its_workspace(tmp_path: Path) -> None:
    async with Checkpoint(tmp_path / "obj") as cp:
        await cp.save(b"async", background=True)
        workspace = cp.path
        assert workspace.is_dir()
    assert not workspace.exists()
    assert (tmp_path / "obj").read_bytes() == b"async"


async def test_aclose_waits_for_a_background_save_off_the_event_loop(tmp_path: Path) -> None:
    cp = Checkpoint(str(tmp_path / "obj"))
    await cp.save(b"in the background", background=True)
    await cp.aclose()
    assert (tmp_path / "obj").read_bytes() == b"in the background"
