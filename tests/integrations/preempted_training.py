"""Training runs the preemption tests start as real processes and send a real SIGTERM to.

``python -m tests.integrations.preempted_training FRAMEWORK WORKDIR --wait-at-step N [--devices D]``

FRAMEWORK is ``lightning`` or ``transformers``. The run trains the tiny model of the framework's
example under the preemption handler (as the runners install it), with the callback under test
mirroring to the checkpoint ``WORKDIR/object``. When step N starts, rank 0 prints ``ready`` and
waits for the notice, so the parent's signal lands inside step N; after each step every rank
prints ``rank R step S``, ``rank R uploaded`` after each upload of its checkpoint, and
``rank R preempted`` if it ends so. ``trainer.fit`` /
``trainer.train`` is the whole task: the process ends however that call ends (``Preempted``
exits with 128 + the signal's number). ``--devices 2`` runs Lightning DDP on the CPU (gloo):
Lightning starts rank 1 as a second process, which gets no signal.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import Preempted
from flyte_checkpoint.preemption import current_notice, install_preemption_handler
from tests.faults.signals.processes import running
from tests.integrations.examples import load_example

NOTICE_TIMEOUT = 30.0


def say(line: str) -> None:
    """One line in one write: the ranks of a DDP run share the pipe."""
    os.write(1, f"{line}\n".encode())


def wait_for_notice() -> None:
    say("ready")
    give_up = time.monotonic() + NOTICE_TIMEOUT
    while current_notice() is None and time.monotonic() < give_up:
        time.sleep(0.01)


def rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


class SlowUploads(Checkpoint):
    """Uploads that take a while (as remote ones do), saying ``rank R uploaded`` when committed:
    the other ranks must still be waiting then."""

    def save_sync(self, data: Any, **kwargs: Any) -> None:
        time.sleep(0.5)
        super().save_sync(data, **kwargs)
        say(f"rank {rank()} uploaded")


def train_lightning(workdir: Path, wait_at_step: int, devices: int) -> None:
    import lightning.pytorch as pl

    from flyte_checkpoint.integrations.lightning import MirroredModelCheckpoint

    example = load_example("lightning_resume")

    class Steps(pl.Callback):
        def on_train_batch_start(
            self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
        ) -> None:
            if trainer.global_step == wait_at_step and trainer.is_global_zero:
                wait_for_notice()

        def on_train_batch_end(
            self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            say(f"rank {rank()} step {trainer.global_step}")

    with SlowUploads(str(workdir / "object")) as checkpoint:
        trainer = pl.Trainer(
            max_epochs=1000,
            accelerator="cpu",
            devices=devices,
            strategy="ddp" if devices > 1 else "auto",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(workdir),
            callbacks=[
                MirroredModelCheckpoint(checkpoint, dirpath=workdir / "checkpoints", save_last=True),
                Steps(),
            ],
        )
        trainer.fit(example.TinyRegressor(), train_dataloaders=example.training_data())


def train_transformers(workdir: Path, wait_at_step: int, devices: int) -> None:
    from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from flyte_checkpoint.integrations.transformers import MirrorOutputDirCallback

    example = load_example("transformers_resume")

    class Steps(TrainerCallback):
        def on_step_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            if state.global_step == wait_at_step:
                wait_for_notice()

        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> None:
            say(f"rank {rank()} step {state.global_step}")

    with SlowUploads(str(workdir / "object")) as checkpoint:
        Trainer(
            model=example.tiny_model(),
            args=example.training_arguments(str(workdir / "output"), max_steps=1000, save_steps=1000),
            train_dataset=example.training_data(),
            callbacks=[MirrorOutputDirCallback(checkpoint), Steps()],
        ).train()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["lightning", "transformers"])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--wait-at-step", type=int, required=True)
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore")
    train = train_lightning if args.framework == "lightning" else train_transformers
    try:
        with install_preemption_handler(grace_seconds=30):
            train(args.workdir, args.wait_at_step, args.devices)
    except Preempted:
        say(f"rank {rank()} preempted")
        raise
    say(f"rank {rank()} training returned")


if __name__ == "__main__":
    main()


def preempt(framework: str, workdir: Path, wait_at_step: int, devices: int = 1) -> tuple[int, list[str]]:
    """Run the training, SIGTERM its first process inside step ``wait_at_step``; that process's
    status, and the output of every process (read to its end: all of them have exited)."""
    argv = [framework, str(workdir), "--wait-at-step", str(wait_at_step), "--devices", str(devices)]
    with running(argv, module="tests.integrations.preempted_training") as program:
        program.wait_for_line("ready", timeout=120)
        program.send(signal.SIGTERM)
        status = program.finish(timeout=60)
    return status, program.lines


def steps_of(lines: list[str], rank: int) -> list[int]:
    """The global steps ``rank`` finished, in order, from the output of :func:`preempt`."""
    prefix = f"rank {rank} step "
    return [int(line[len(prefix) :]) for line in lines if line.startswith(prefix)]
