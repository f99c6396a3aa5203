"""Plain PyTorch: model, optimizer and epoch saved in one file; a retry resumes all three."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from flyte_checkpoint import run_with_retries
from tests.integrations.examples import load_example

example = load_example("pytorch_resume")


class Start:
    """What one attempt started from: its first epoch, weights and optimizer state."""

    def __init__(self, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.epoch = epoch
        self.weights = {name: value.detach().clone() for name, value in model.state_dict().items()}
        self.optimizer = copy.deepcopy(optimizer.state_dict())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Start], dict[str, Any], int]:
    """6 epochs, attempt 0 crashes in epoch 3; returns the starts, the file resumed from, the result."""
    root = tmp_path_factory.mktemp("pytorch")
    starts: list[Start] = []

    def on_start(epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        starts.append(Start(epoch, model, optimizer))

    result = run_with_retries(
        example.train,
        6,
        3,
        str(root / "work"),
        on_start=on_start,
        retries=1,
        checkpoint_dir=root / "checkpoints",
    )
    # The object the retry loaded: the runner staged it at prev_checkpoint before attempt 1.
    resumed_from = torch.load(root / "checkpoints" / "prev_checkpoint", map_location="cpu", weights_only=True)
    return starts, resumed_from, result


def test_a_retry_resumes_at_the_epoch_after_the_last_saved_one(
    run: tuple[list[Start], dict[str, Any], int],
) -> None:
    starts, resumed_from, _ = run
    assert resumed_from["epoch"] == 2
    assert [start.epoch for start in starts] == [0, 3]


def test_a_retry_restores_the_saved_weights(run: tuple[list[Start], dict[str, Any], int]) -> None:
    starts, resumed_from, _ = run
    for name, value in resumed_from["model"].items():
        assert torch.equal(starts[1].weights[name], value), name
    assert not torch.equal(starts[1].weights["weight"], starts[0].weights["weight"])


def test_a_retry_restores_the_optimizer_state(run: tuple[list[Start], dict[str, Any], int]) -> None:
    starts, resumed_from, _ = run
    restored = starts[1].optimizer["state"]
    saved = resumed_from["opt"]["state"]
    assert restored.keys() == saved.keys() == {0, 1}
    for index, values in saved.items():
        for key, value in values.items():
            assert torch.equal(torch.as_tensor(restored[index][key]), torch.as_tensor(value)), (index, key)
    assert starts[0].optimizer["state"] == {}


def test_the_resumed_run_finishes_every_epoch(run: tuple[list[Start], dict[str, Any], int]) -> None:
    _, _, result = run
    assert result == 5


def test_the_example_script_resumes_after_its_planned_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["--epochs", "4", "--fail-at-epoch", "2", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempt 0: starting fresh" in out
    assert "attempt 1: resuming at epoch 2" in out
    assert out.strip().endswith("result: last epoch 3")
