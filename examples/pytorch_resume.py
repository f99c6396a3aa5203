"""Example: a plain PyTorch loop that keeps model, optimizer and epoch in one file and resumes all three.

Run it with ``python examples/pytorch_resume.py`` (needs ``pip install torch==2.13.0``). A linear
model trains on CPU, saving ``{"model", "opt", "epoch"}`` with ``torch.save`` after every epoch
and uploading that file as the checkpoint; the first attempt fails on purpose; the retry loads
the file, restores the weights and the optimizer state, and carries on at the next epoch.

The task is ``async def`` to show the awaited pair (``await checkpoint.load()`` /
``await checkpoint.save(...)``); a ``def`` task would call ``load_sync()`` / ``save_sync()``.
Inside a Flyte task it works unchanged once ``flyte_checkpoint.integrations.flyte.install()`` ran.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from flyte_checkpoint import ctx, run_with_retries

StartHook = Callable[[int, torch.nn.Module, torch.optim.Optimizer], None]


class PlannedFailure(RuntimeError):
    """The crash this example injects to show a retry resuming."""


def batch_for(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of ``epoch``: the same on every attempt, so a resumed run is reproducible."""
    generator = torch.Generator().manual_seed(epoch)
    inputs = torch.randn(8, 4, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


async def train(
    epochs: int, fail_at_epoch: int | None, workdir: str, on_start: StartHook | None = None
) -> int:
    """Train for ``epochs``, resuming from the saved file; return the last epoch trained.

    ``on_start(first_epoch, model, optimizer)`` is called once the state is restored (or not).
    """
    context = ctx()
    checkpoint = context.checkpoint if context is not None else None
    if context is None or checkpoint is None:
        raise RuntimeError("train runs inside a task: call it through run_with_retries or a Flyte task")

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)

    restored = await checkpoint.load()  # None on a first attempt; else path / "payload"
    if restored is not None:
        blob = torch.load(restored, map_location="cpu", weights_only=True)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["opt"])
        start = int(blob["epoch"]) + 1
    else:
        start = 0
    print(
        f"attempt {context.attempt_number}: " + (f"resuming at epoch {start}" if start else "starting fresh")
    )
    if on_start is not None:
        on_start(start, model, opt)

    state_file = Path(workdir) / "training.pt"
    state_file.parent.mkdir(parents=True, exist_ok=True)
    for epoch in range(start, epochs):
        if context.attempt_number == 0 and epoch == fail_at_epoch:
            raise PlannedFailure(f"planned failure in epoch {epoch}")
        inputs, targets = batch_for(epoch)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        opt.zero_grad()
        torch.autograd.backward(loss)
        opt.step()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, state_file)
        await checkpoint.save(state_file)
    print(f"attempt {context.attempt_number}: finished epoch {epochs - 1}")
    return epochs - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=6, help="epochs to train (default 6)")
    parser.add_argument("--fail-at-epoch", type=int, default=3, help="epoch the first attempt crashes in")
    parser.add_argument("--workdir", default=None, help="local training directory (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="pytorch-resume-") as scratch:
        workdir = args.workdir or scratch
        last_epoch = run_with_retries(train, args.epochs, args.fail_at_epoch, workdir, retries=1)
    print(f"result: last epoch {last_epoch}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
