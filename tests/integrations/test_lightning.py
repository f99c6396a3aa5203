"""Lightning: a tiny model really trains on CPU, crashes mid-epoch, and a retry resumes it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import pytest
import torch

from flyte_checkpoint import Checkpoint, InvalidCheckpointInputError, ctx, run_with_retries
from flyte_checkpoint.errors import ConfigurationError, Preempted
from flyte_checkpoint.integrations.lightning import MirroredModelCheckpoint, restore_last_checkpoint
from flyte_checkpoint.preemption import notice
from tests.integrations.examples import load_example
from tests.integrations.preempted_training import preempt, steps_of

example = load_example("lightning_resume")
STEPS_PER_EPOCH = 4  # 32 samples in batches of 8

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

Weights = dict[str, torch.Tensor]


def weights_of(module: pl.LightningModule) -> Weights:
    return {name: value.detach().clone() for name, value in module.state_dict().items()}


class Recorder(pl.Callback):
    """Where each attempt started, and the weights at the end of every epoch."""

    def __init__(self) -> None:
        self.starts: list[tuple[int, int, int, Weights]] = []
        self.epoch_end_weights: dict[tuple[int, int], Weights] = {}

    @staticmethod
    def attempt() -> int:
        context = ctx()
        assert context is not None
        return context.attempt_number

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.starts.append(
            (self.attempt(), trainer.current_epoch, trainer.global_step, weights_of(pl_module))
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epoch_end_weights[(self.attempt(), trainer.current_epoch)] = weights_of(pl_module)


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recorder, int]:
    """One run of the example's task: 4 epochs, attempt 0 crashes in epoch 2, attempt 1 resumes."""
    root = tmp_path_factory.mktemp("lightning")
    recorder = Recorder()
    step = run_with_retries(
        example.train, 4, 2, str(root / "work"), [recorder], retries=1, checkpoint_dir=root / "checkpoints"
    )
    return recorder, step


def test_a_retry_resumes_lightning_at_the_epoch_the_crash_interrupted(
    crashed_and_resumed: tuple[Recorder, int],
) -> None:
    recorder, _ = crashed_and_resumed
    assert [(attempt, epoch, step) for attempt, epoch, step, _ in recorder.starts] == [
        (0, 0, 0),
        (1, 2, 2 * STEPS_PER_EPOCH),
    ]


def test_a_retry_restores_the_weights_of_the_last_finished_epoch(
    crashed_and_resumed: tuple[Recorder, int],
) -> None:
    recorder, _ = crashed_and_resumed
    resumed_weights = recorder.starts[1][3]
    saved_weights = recorder.epoch_end_weights[(0, 1)]
    assert resumed_weights.keys() == saved_weights.keys()
    for name, value in saved_weights.items():
        assert torch.equal(resumed_weights[name], value), name
    assert not torch.equal(resumed_weights["layer.weight"], recorder.starts[0][3]["layer.weight"])


def test_the_resumed_run_trains_to_the_end(crashed_and_resumed: tuple[Recorder, int]) -> None:
    recorder, step = crashed_and_resumed
    assert step == 4 * STEPS_PER_EPOCH
    assert (1, 3) in recorder.epoch_end_weights


def test_the_callback_saves_its_directory_after_each_epoch(tmp_path: Path) -> None:
    dirpath = tmp_path / "ckpts"
    saved: list[set[str]] = []

    class Spy(Checkpoint):
        def save_sync(self, data: Any, **kwargs: Any) -> None:
            saved.append({path.name for path in Path(data).iterdir()})
            super().save_sync(data, **kwargs)

    with Spy(str(tmp_path / "object")) as checkpoint:
        trainer = pl.Trainer(
            max_epochs=2,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[MirroredModelCheckpoint(checkpoint, dirpath=dirpath, save_last=True)],
        )
        trainer.fit(example.TinyRegressor(), train_dataloaders=example.training_data())
    assert saved == [
        {"epoch=0-step=4.ckpt", "last.ckpt"},
        {"epoch=1-step=8.ckpt", "last.ckpt"},
    ]


def test_restore_last_checkpoint_is_none_on_a_first_attempt(tmp_path: Path) -> None:
    with Checkpoint(str(tmp_path / "object")) as checkpoint:
        assert restore_last_checkpoint(checkpoint, dirpath=tmp_path / "ckpts") is None


def test_restore_last_checkpoint_puts_the_restored_files_in_place_of_dirpath(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    (saved / "nested").mkdir(parents=True)
    (saved / "epoch=3-step=40.ckpt").write_bytes(b"top-k")
    (saved / "nested" / "last.ckpt").write_bytes(b"last")
    with Checkpoint(str(tmp_path / "object")) as writer:
        writer.save_sync(saved)
    dirpath = tmp_path / "ckpts"
    dirpath.mkdir()
    (dirpath / "stale.ckpt").write_bytes(b"from the failed attempt")
    with Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint:
        last = restore_last_checkpoint(checkpoint, dirpath=dirpath)
    assert last == dirpath / "nested" / "last.ckpt"
    assert sorted(path.name for path in dirpath.rglob("*.ckpt")) == ["epoch=3-step=40.ckpt", "last.ckpt"]


def test_restore_last_checkpoint_refuses_a_single_object_checkpoint(tmp_path: Path) -> None:
    with Checkpoint(str(tmp_path / "object")) as writer:
        writer.save_sync(b"not a directory")
    with (
        Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint,
        pytest.raises(InvalidCheckpointInputError, match="single object"),
    ):
        restore_last_checkpoint(checkpoint)


def test_the_callback_refuses_a_remote_dirpath(tmp_path: Path) -> None:
    with (
        Checkpoint(str(tmp_path / "object")) as checkpoint,
        pytest.raises(InvalidCheckpointInputError, match="local directory"),
    ):
        MirroredModelCheckpoint(checkpoint, dirpath="s3://bucket/checkpoints")


def test_the_example_script_resumes_after_its_planned_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert example.main(["--epochs", "3", "--fail-at-epoch", "1", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "attempt 0: starting fresh" in out
    assert "attempt 1: resuming from last.ckpt" in out
    assert out.strip().endswith(f"result: global step {3 * STEPS_PER_EPOCH}")


# --------------------------------------------------------------------------- preemption


def resumed_step(tmp_path: Path) -> int:
    """The global step a retry of the run in ``tmp_path`` resumes at (from the saved ``last.ckpt``)."""
    with Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as checkpoint:
        last = restore_last_checkpoint(checkpoint, dirpath=tmp_path / "restored")
        assert last is not None
        step: int = torch.load(last, weights_only=False)["global_step"]
        return step


def test_a_sigterm_mid_fit_saves_the_next_step_stops_and_exits_as_preempted(tmp_path: Path) -> None:
    status, lines = preempt("lightning", tmp_path, wait_at_step=5)
    assert status == 143, "\n".join(lines)
    assert steps_of(lines, 0)[-1] == 6, "training went on after the step that saved"
    assert "rank 0 preempted" in lines
    assert resumed_step(tmp_path) == 6


def test_under_ddp_a_sigterm_on_one_rank_stops_both_at_the_same_step_and_neither_hangs(
    tmp_path: Path,
) -> None:
    status, lines = preempt("lightning", tmp_path, wait_at_step=5, devices=2)
    assert status == 143, "\n".join(lines)
    assert {"rank 0 preempted", "rank 1 preempted"} <= set(lines), "\n".join(lines)
    assert steps_of(lines, 0)[-1] == steps_of(lines, 1)[-1] == 6, "\n".join(lines)
    last_upload = len(lines) - 1 - lines[::-1].index("rank 0 uploaded")
    assert last_upload < lines.index("rank 1 preempted"), "rank 1 exited before rank 0's upload committed"
    assert resumed_step(tmp_path) == 6


class NoticeAt(pl.Callback):
    """Records a preemption notice when the batch of ``step`` starts (as the SIGTERM handler does)."""

    def __init__(self, step: int, grace_seconds: float = 30.0) -> None:
        self.step = step
        self.grace_seconds = grace_seconds

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            notice.notify("SIGTERM", self.grace_seconds, signal.SIGTERM)


@pytest.fixture
def clean_notice() -> Iterator[None]:
    notice.clear()
    yield
    notice.clear()


def fit_with_notice(
    tmp_path: Path,
    checkpoint: Checkpoint,
    *,
    on_preemption: Literal["raise", "stop"] = "raise",
    grace_seconds: float = 30.0,
) -> pl.Trainer:
    trainer = pl.Trainer(
        max_epochs=5,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            MirroredModelCheckpoint(
                checkpoint, dirpath=tmp_path / "ckpts", save_last=True, on_preemption=on_preemption
            ),
            NoticeAt(2, grace_seconds),
        ],
    )
    trainer.fit(example.TinyRegressor(), train_dataloaders=example.training_data())
    return trainer


def test_with_on_preemption_stop_fit_returns_at_the_step_after_the_notice(
    tmp_path: Path, clean_notice: None
) -> None:
    with Checkpoint(str(tmp_path / "object")) as checkpoint:
        trainer = fit_with_notice(tmp_path, checkpoint, on_preemption="stop")
        assert trainer.global_step == 3
        assert checkpoint.preempted
        assert checkpoint.preemption().saved is True
    assert torch.load(tmp_path / "ckpts" / "last.ckpt", weights_only=False)["global_step"] == 3


def test_a_save_that_cannot_commit_in_time_still_stops_fit_as_preempted_with_nothing_saved(
    tmp_path: Path, clean_notice: None
) -> None:
    with Checkpoint(str(tmp_path / "object")) as checkpoint:
        with pytest.raises(Preempted) as raised:
            fit_with_notice(tmp_path, checkpoint, grace_seconds=0.001)  # the deadline has passed
        assert raised.value.saved is False
        assert "no save" in str(raised.value)


def test_on_preemption_must_be_raise_or_stop(tmp_path: Path) -> None:
    with (
        Checkpoint(str(tmp_path / "object")) as checkpoint,
        pytest.raises(ConfigurationError, match='"raise"'),
    ):
        MirroredModelCheckpoint(checkpoint, dirpath=tmp_path / "ckpts", on_preemption="exit")  # type: ignore[arg-type]
