"""Known limitation 1 of the spec: a failing part never hangs a save, and never commits anything.

(Failures of parts written by other processes are in test_rank_processes.py.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import CheckpointError, CheckpointPermissionError
from flyte_checkpoint.state import load_checkpoint, parts, save_checkpoint
from flyte_checkpoint.state.components import Payload
from flyte_checkpoint.state.layout import Layout
from flyte_checkpoint.state.objects import Written, write_object
from flyte_checkpoint.state.pointer import read_pointer
from flyte_checkpoint.storage import Backend
from tests.state.workers import Unit
from tests.stores import Store


class RaisingUnit(Unit):
    def state_dict(self) -> dict[str, Any]:
        raise ValueError("state is on fire")


def save_previous(store: Store) -> tuple[str, str]:
    checkpoint_dir = store.uri("ckpt")
    manifest = save_checkpoint(
        checkpoint_dir,
        controller=None,
        parts=[Unit({0: "previous"}), Unit({1: "previous"}), Unit({2: "previous"})],
        storage_options=store.storage_options,
    )
    return checkpoint_dir, manifest.version_id


def assert_only_the_previous_is_there(store: Store, checkpoint_dir: str, version: str) -> None:
    layout = Layout.of(checkpoint_dir, store.storage_options)
    pointer = read_pointer(layout)
    assert pointer is not None
    assert pointer.version_id == version
    assert layout.list_versions() == [version]
    units = [Unit(), Unit(), Unit()]
    load_checkpoint(checkpoint_dir, controller=None, parts=units, storage_options=store.storage_options)
    assert [unit.data for unit in units] == [{0: "previous"}, {1: "previous"}, {2: "previous"}]


def test_a_component_whose_state_dict_raises_fails_the_save_naming_its_position_and_cause(
    local_store: Store,
) -> None:
    checkpoint_dir, previous = save_previous(local_store)
    with pytest.raises(
        CheckpointError, match=r"part 1 failed: capturing its state raised ValueError: state is on fire"
    ) as caught:
        save_checkpoint(checkpoint_dir, controller=None, parts=[Unit(), RaisingUnit(), Unit()])
    assert isinstance(caught.value.__cause__, ValueError)
    assert_only_the_previous_is_there(local_store, checkpoint_dir, previous)


def test_a_part_whose_write_fails_fails_the_save_naming_it_and_keeping_the_error_type(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint_dir, previous = save_previous(any_store)

    def write_refused_for_part_2(backend: Backend, uri: str, payload: Payload, progress: object) -> Written:
        if uri.endswith("part-00002.bin"):
            raise CheckpointPermissionError(f"permission denied saving {uri}")
        return write_object(backend, uri, payload)

    monkeypatch.setattr(parts, "write_object", write_refused_for_part_2)
    with pytest.raises(CheckpointPermissionError, match=r"^permission denied saving .*part-00002") as caught:
        save_checkpoint(
            checkpoint_dir,
            controller=None,
            parts=[Unit({0: "new"}), Unit({1: "new"}), Unit({2: "new"})],
            storage_options=any_store.storage_options,
        )
    assert getattr(caught.value, "__notes__", None) == [
        "part 2 failed; nothing was saved; the previous checkpoint is unchanged"
    ]
    assert_only_the_previous_is_there(any_store, checkpoint_dir, previous)


def test_a_part_whose_write_hangs_fails_the_save_at_its_timeout(
    local_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint_dir, previous = save_previous(local_store)
    release = threading.Event()

    def write_stuck_for_part_1(backend: Backend, uri: str, payload: Payload, progress: object) -> Written:
        if uri.endswith("part-00001.bin"):
            release.wait(10)
        return write_object(backend, uri, payload)

    monkeypatch.setattr(parts, "write_object", write_stuck_for_part_1)
    started = time.monotonic()
    try:
        with pytest.raises(CheckpointError, match=r"did not finish within 0\.5 s \(part 1 still running\)"):
            save_checkpoint(checkpoint_dir, controller=None, parts=[Unit(), Unit(), Unit()], timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        release.set()
    assert read_pointer(Layout.of(checkpoint_dir)).version_id == previous  # type: ignore[union-attr]


def test_a_lock_held_elsewhere_fails_the_save_at_its_timeout_before_anything_is_written(
    tmp_path: Path,
) -> None:
    lock = threading.Lock()
    checkpoint_dir = tmp_path / "ckpt"
    with lock, pytest.raises(CheckpointError, match=r"lock was not free within 0\.2 s; nothing was saved"):
        save_checkpoint(checkpoint_dir, controller=None, parts=[Unit()], lock=lock, timeout=0.2)
    assert not checkpoint_dir.exists()


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_a_timeout_that_is_not_a_positive_finite_number_is_rejected(tmp_path: Path, timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        save_checkpoint(tmp_path / "ckpt", controller=None, parts=[Unit()], timeout=timeout)


def test_an_asyncio_lock_is_refused_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"asyncio lock cannot guard a blocking save.*threading\.Lock"):
        save_checkpoint(tmp_path / "ckpt", controller=None, parts=[Unit()], lock=asyncio.Lock())  # type: ignore[arg-type]
