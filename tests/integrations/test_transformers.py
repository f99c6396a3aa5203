"""Hugging Face Trainer: a tiny GPT-2 really trains on CPU, crashes mid-run, and a retry resumes it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from flyte_checkpoint import Checkpoint, InvalidCheckpointInputError, ctx, run_with_retries
from flyte_checkpoint.integrations.transformers import MirrorOutputDirCallback, restore_last_checkpoint
from flyte_checkpoint.preemption import notice
from tests.integrations.examples import load_example
from tests.integrations.preempted_training import preempt, steps_of

example = load_example("transformers_resume")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

Weights = dict[str, torch.Tensor]


def weights_of(model: torch.nn.Module) -> Weights:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


class Recorder(TrainerCallback):
    """Where each attempt started, and the weights at every checkpoint it saved."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, int, Weights]] = []
        self.saved_weights: dict[tuple[int, int], Weights] = {}

    @staticmethod
    def attempt() -> int:
        context = ctx()
        assert context is not None
        return context.attempt_number

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.starts.append((self.attempt(), state.global_step, weights_of(kwargs["model"])))

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.saved_weights[(self.attempt(), state.global_step)] = weights_of(kwargs["model"])


class ListingSaves(Checkpoint):
    """A checkpoint that records what each directory it saves holds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listings: list[list[str]] = []

    def save_sync(self, data: Any, **kwargs: Any) -> None:
        self.listings.append(sorted(path.name for path in Path(data).iterdir()))
        super().save_sync(data, **kwargs)


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recorder, int]:
    """One run of the example's task: 8 steps, a checkpoint every 2, attempt 0 crashes after step 5."""
    root = tmp_path_factory.mktemp("transformers")
    recorder = Recorder()
    step = run_with_retries(
        example.train, 8, 2, 5, str(root / "work"), [recorder], retries=1, checkpoint_dir=root / "checkpoints"
    )
    return recorder, step


def test_a_retry_resumes_the_trainer_at_the_last_saved_step(
    crashed_and_resumed: tuple[Recorder, int],
) -> None:
    recorder, _ = crashed_and_resumed
    assert [(attempt, step) for attempt, step, _ in recorder.starts] == [(0, 0), (1, 4)]


def test_a_retry_restores_the_weights_of_the_last_saved_step(
    crashed_and_resumed: tuple[Recorder, int],
) -> None:
    recorder, _ = crashed_and_resumed
    resumed_weights = recorder.starts[1][2]
    saved_weights = recorder.saved_weights[(0, 4)]
    assert resumed_weights.keys() == saved_weights.keys()
    for name, value in saved_weights.items():
        assert torch.equal(resumed_weights[name], value), name
    first_start = recorder.starts[0][2]
    assert not all(torch.equal(first_start[name], value) for name, value in saved_weights.items())


def test_the_resumed_trainer_trains_to_the_end(crashed_and_resumed: tuple[Recorder, int]) -> None:
    recorder, step = crashed_and_resumed
    assert step == 8
    assert (1, 8) in recorder.saved_weights


def test_the_callback_saves_the_output_directory_after_each_checkpoint(tmp_path: Path) -> None:
    checkpoint = ListingSaves(str(tmp_path / "object"))
    with checkpoint:
        Trainer(
            model=example.tiny_model(),
            args=example.training_arguments(str(tmp_path / "output"), max_steps=4, save_steps=2),
            train_dataset=example.training_data(),
            callbacks=[MirrorOutputDirCallback(checkpoint)],
        ).train()
    assert checkpoint.listings == [["checkpoint-2"], ["checkpoint-2", "checkpoint-4"]]


def test_restore_last_checkpoint_is_none_on_a_first_attempt(tmp_path: Path) -> None:
    with Checkpoint(str(tmp_path / "object")) as checkpoint:
        assert restore_last_checkpoint(checkpoint, output_dir=tmp_path / "output") is None


def test_restore_last_checkpoint_returns_the_highest_step_in_place_of_output_dir(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    for step in (9, 10):
        (saved / f"checkpoint-{step}").mkdir(parents=True)
        (saved / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    with Checkpoint(str(tmp_path / "object")) as writer:
        writer.save_sync(saved)
    output_dir = tmp_path / "output"
    (output_dir / "checkpoint-11").mkdir(parents=True)  # left by the failed attempt, never saved
    with Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint:
        last = restore_last_checkpoint(checkpoint, output_dir=output_dir)
    assert last == str(output_dir / "checkpoint-10")
    assert sorted(path.name for path in output_dir.iterdir()) == ["checkpoint-10", "checkpoint-9"]


def test_restore_last_checkpoint_refuses_a_single_object_checkpoint(tmp_path: Path) -> None:
    with Checkpoint(str(tmp_path / "object")) as writer:
        writer.save_sync(b"not a directory")
    with (
        Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint,
        pytest.raises(InvalidCheckpointInputError, match="single object"),
    ):
        restore_last_checkpoint(checkpoint)


def test_the_example_script_resumes_after_its_planned_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["--steps", "6", "--fail-at-step", "3", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempt 0: starting fresh" in out
    assert "attempt 1: resuming from checkpoint-2" in out
    assert out.strip().endswith("result: global step 6")


# --------------------------------------------------------------------------- preemption


def test_a_sigterm_mid_training_saves_the_next_step_stops_and_exits_as_preempted(tmp_path: Path) -> None:
    status, lines = preempt("transformers", tmp_path, wait_at_step=5)
    assert status == 143, "\n".join(lines)
    assert steps_of(lines, 0)[-1] == 6, "training went on after the step that saved"
    assert "rank 0 preempted" in lines
    with Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint:
        last = restore_last_checkpoint(checkpoint, output_dir=tmp_path / "restored")
    assert last is not None
    assert Path(last).name == "checkpoint-6"


class NoticeAt(TrainerCallback):
    """Records a preemption notice when step ``step`` begins (as the SIGTERM handler does)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.global_step == self.step:
            notice.notify("SIGTERM", 30.0, signal.SIGTERM)


@pytest.fixture
def clean_notice() -> Iterator[None]:
    notice.clear()
    yield
    notice.clear()


def test_with_on_preemption_stop_train_returns_at_the_step_after_the_notice_with_it_saved(
    tmp_path: Path, clean_notice: None
) -> None:
    checkpoint = ListingSaves(str(tmp_path / "object"))
    with checkpoint:
        trainer = Trainer(
            model=example.tiny_model(),
            args=example.training_arguments(str(tmp_path / "output"), max_steps=40, save_steps=100),
            train_dataset=example.training_data(),
            callbacks=[MirrorOutputDirCallback(checkpoint, on_preemption="stop"), NoticeAt(2)],
        )
        trainer.train()
        assert trainer.state.global_step == 3
        assert checkpoint.preemption().saved is True
    assert checkpoint.listings == [["checkpoint-3"]]
