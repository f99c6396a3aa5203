"""Example: a Lightning run that crashes mid-epoch and resumes from its last checkpoint on retry.

Run it with ``python examples/lightning_resume.py`` (needs ``pip install torch==2.13.0`` and
``pip install '.[lightning]'``). A tiny regressor trains on CPU for a few epochs;
the first attempt fails on purpose in the middle of an epoch; the retry restores the directory
``MirroredModelCheckpoint`` saved after the last finished epoch and continues from there.

Inside a Flyte task the same function works unchanged once
``flyte_checkpoint.integrations.flyte.install()`` has run.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from flyte_checkpoint import ctx, run_with_retries
from flyte_checkpoint.integrations.lightning import MirroredModelCheckpoint, restore_last_checkpoint


class PlannedFailure(RuntimeError):
    """The crash this example injects to show a retry resuming."""


class TinyRegressor(pl.LightningModule):
    """One linear layer: enough to have weights, an optimizer state and a loss that goes down."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class FailOnFirstAttempt(pl.Callback):
    """Raise :class:`PlannedFailure` at ``(epoch, batch)`` on attempt 0 only."""

    def __init__(self, epoch: int, batch: int = 1) -> None:
        self.epoch = epoch
        self.batch = batch

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        context = ctx()
        attempt = context.attempt_number if context is not None else 0
        if attempt == 0 and trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise PlannedFailure(f"planned failure in epoch {self.epoch}, batch {batch_idx}")


def training_data(samples: int = 32, batch_size: int = 8) -> DataLoader[tuple[torch.Tensor, ...]]:
    """A fixed regression problem (the same on every attempt): y = x @ w + noise."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, 4, generator=generator)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(
        samples, 1, generator=generator
    )
    return DataLoader(TensorDataset(inputs, targets), batch_size=batch_size, shuffle=False)


def train(
    max_epochs: int,
    fail_at_epoch: int | None,
    workdir: str,
    callbacks: Sequence[pl.Callback] = (),
) -> int:
    """Train for ``max_epochs``, resuming from the last mirrored checkpoint; return the global step."""
    context = ctx()
    checkpoint = context.checkpoint if context is not None else None
    if context is None or checkpoint is None:
        raise RuntimeError("train runs inside a task: call it through run_with_retries or a Flyte task")
    dirpath = Path(workdir) / "checkpoints"
    last = restore_last_checkpoint(checkpoint, dirpath=dirpath)
    print(
        f"attempt {context.attempt_number}: " + (f"resuming from {last.name}" if last else "starting fresh")
    )

    torch.manual_seed(0)
    model = TinyRegressor()
    planned = [FailOnFirstAttempt(fail_at_epoch)] if fail_at_epoch is not None else []
    trainer = pl.Trainer(
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=workdir,
        callbacks=[
            MirroredModelCheckpoint(checkpoint, dirpath=dirpath, save_last=True),
            *planned,
            *callbacks,
        ],
    )
    trainer.fit(model, train_dataloaders=training_data(), ckpt_path=str(last) if last else None)
    epoch, step = trainer.current_epoch, trainer.global_step
    print(f"attempt {context.attempt_number}: finished at epoch {epoch}, step {step}")
    return trainer.global_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs to train (default 4)")
    parser.add_argument("--fail-at-epoch", type=int, default=2, help="epoch the first attempt crashes in")
    parser.add_argument("--workdir", default=None, help="local training directory (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="lightning-resume-") as scratch:
        workdir = args.workdir or scratch
        step = run_with_retries(train, args.epochs, args.fail_at_epoch, workdir, retries=1)
    print(f"result: global step {step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
