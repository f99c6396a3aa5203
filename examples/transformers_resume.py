"""Example: a Hugging Face ``Trainer`` run that crashes mid-run and resumes from its last checkpoint.

Run it with ``python examples/transformers_resume.py`` (needs ``pip install torch==2.13.0`` and
``pip install '.[transformers]'``). A one-layer GPT-2 built from a config in code
(hidden size 16, vocabulary 32: nothing is downloaded) trains on CPU on made-up token sequences
and writes ``checkpoint-<step>`` folders; ``MirrorOutputDirCallback`` saves the output directory
after each one. The first attempt fails on purpose between two checkpoints; the retry restores
the directory and ``Trainer`` resumes from the newest checkpoint in it.

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

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState

from flyte_checkpoint import ctx, run_with_retries
from flyte_checkpoint.integrations.transformers import MirrorOutputDirCallback, restore_last_checkpoint

VOCAB_SIZE = 32
SEQUENCE_LENGTH = 8


class PlannedFailure(RuntimeError):
    """The crash this example injects to show a retry resuming."""


class FailOnFirstAttempt(TrainerCallback):
    """Raise :class:`PlannedFailure` when attempt 0 finishes step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        context = ctx()
        attempt = context.attempt_number if context is not None else 0
        if attempt == 0 and state.global_step == self.step:
            raise PlannedFailure(f"planned failure after step {state.global_step}")


def tiny_model() -> GPT2LMHeadModel:
    """A randomly initialised one-layer GPT-2 (about 10k parameters), the same on every attempt."""
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=SEQUENCE_LENGTH,
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_inner=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def training_data(samples: int = 32) -> list[dict[str, torch.Tensor]]:
    """Made-up token sequences that count upwards, so there is something to learn."""
    generator = torch.Generator().manual_seed(0)
    starts = torch.randint(0, VOCAB_SIZE, (samples, 1), generator=generator)
    sequences = (starts + torch.arange(SEQUENCE_LENGTH)) % VOCAB_SIZE
    return [{"input_ids": row, "labels": row} for row in sequences]


def training_arguments(output_dir: str, max_steps: int, save_steps: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=save_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )


def train(
    max_steps: int,
    save_steps: int,
    fail_at_step: int | None,
    workdir: str,
    callbacks: Sequence[TrainerCallback] = (),
) -> int:
    """Train for ``max_steps``, resuming from the last saved checkpoint; return the global step."""
    context = ctx()
    checkpoint = context.checkpoint if context is not None else None
    if context is None or checkpoint is None:
        raise RuntimeError("train runs inside a task: call it through run_with_retries or a Flyte task")
    output_dir = str(Path(workdir) / "output")
    last = restore_last_checkpoint(checkpoint, output_dir=output_dir)
    print(
        f"attempt {context.attempt_number}: "
        + (f"resuming from {Path(last).name}" if last else "starting fresh"),
        flush=True,
    )
    planned = [FailOnFirstAttempt(fail_at_step)] if fail_at_step is not None else []
    trainer = Trainer(
        model=tiny_model(),
        args=training_arguments(output_dir, max_steps, save_steps),
        train_dataset=training_data(),
        callbacks=[MirrorOutputDirCallback(checkpoint), *planned, *callbacks],
    )
    trainer.train(resume_from_checkpoint=last)
    print(f"attempt {context.attempt_number}: finished at step {trainer.state.global_step}", flush=True)
    return trainer.state.global_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps to train (default 8)")
    parser.add_argument("--save-steps", type=int, default=2, help="save a checkpoint every N steps")
    parser.add_argument("--fail-at-step", type=int, default=5, help="step the first attempt crashes after")
    parser.add_argument("--workdir", default=None, help="local training directory (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    with tempfile.TemporaryDirectory(prefix="transformers-resume-") as scratch:
        workdir = args.workdir or scratch
        step = run_with_retries(train, args.steps, args.save_steps, args.fail_at_step, workdir, retries=1)
    print(f"result: global step {step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
