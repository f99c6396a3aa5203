"""Every public entry point that takes a location works the same given a relative path, an
absolute path or a file:// URI: a relative root silently lost every step before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.state import CheckpointManager, StateCheckpoint, load_checkpoint, save_checkpoint
from flyte_checkpoint.storage import copy_object

SPELLINGS = ["relative", "absolute", "file-uri"]


def spelled(how: str, name: str, base: Path) -> str:
    """``base / name`` as the test's working directory (``base``) sees it, spelled ``how``."""
    if how == "relative":
        return name
    if how == "absolute":
        return str(base / name)
    return (base / name).as_uri()


class Counter:
    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("how", SPELLINGS)
def test_a_manager_lists_loads_and_retains_its_steps_however_its_root_is_spelled(
    how: str, tmp_path: Path
) -> None:
    manager = CheckpointManager(spelled(how, "steps", tmp_path), keep_last=2)
    for step in range(4):
        manager.save(step, controller=None, parts=[Counter(step)])
    assert manager.steps() == [2, 3]
    restored = Counter()
    loaded = CheckpointManager(spelled(how, "steps", tmp_path)).load(controller=None, parts=[restored])
    assert loaded is not None
    assert (loaded.step, restored.value) == (3, 3)
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["step_2", "step_3"]


@pytest.mark.parametrize("how", SPELLINGS)
def test_a_multi_part_checkpoint_round_trips_however_its_directory_is_spelled(
    how: str, tmp_path: Path
) -> None:
    location = spelled(how, "state", tmp_path)
    save_checkpoint(location, controller=Counter(7), parts=[Counter(1), Counter(2)])
    controller, parts = Counter(), [Counter(), Counter()]
    load_checkpoint(location, controller=controller, parts=parts)
    assert (controller.value, [part.value for part in parts]) == (7, [1, 2])
    assert StateCheckpoint(location).manifest().parts


@pytest.mark.parametrize("how", SPELLINGS)
def test_a_checkpoint_saves_and_loads_however_its_locations_are_spelled(how: str, tmp_path: Path) -> None:
    Checkpoint(spelled(how, "ckpt", tmp_path)).save_sync(b"state")
    copy_object(spelled(how, "ckpt", tmp_path), spelled(how, "copy", tmp_path))
    with Checkpoint(spelled(how, "unused", tmp_path), spelled(how, "copy", tmp_path)) as helper:
        restored = helper.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state"
    assert (tmp_path / "ckpt").read_bytes() == b"state"


@pytest.mark.parametrize("how", SPELLINGS)
def test_a_retried_run_resumes_and_finds_its_dcp_roots_however_its_directory_is_spelled(
    how: str, tmp_path: Path
) -> None:
    from flyte_checkpoint import current_checkpoint, run_with_retries
    from flyte_checkpoint.distributed import task_locations

    seen: list[str] = []

    def task() -> int:
        helper = current_checkpoint()
        restored = helper.load_sync()
        seen.append(task_locations().save_root)
        if restored is None:
            helper.save_sync(b"1")
            raise RuntimeError("fail once")
        return int(restored.read_bytes())

    assert run_with_retries(task, retries=1, checkpoint_dir=spelled(how, "run", tmp_path)) == 1
    expected = str(tmp_path / "run" / "checkpoint.dcp")
    assert {root.removeprefix("file://") for root in seen} == {expected}


@pytest.mark.parametrize("how", SPELLINGS)
def test_the_command_lists_committed_steps_however_the_root_is_spelled(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flyte_checkpoint.cli import main

    manager = CheckpointManager(spelled(how, "steps", tmp_path))
    manager.save(5, controller=None, parts=[Counter(5)])
    assert main(["ls", spelled(how, "steps", tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "5" in listing
    assert "uncommitted" not in listing
