"""Hugging Face ``Trainer``: save the output directory after each checkpoint, and resume from it.

Install with ``pip install torch==2.13.0`` (or any build you prefer) then
``pip install '.[transformers]'``::

    from flyte_checkpoint import ctx
    from flyte_checkpoint.integrations.transformers import MirrorOutputDirCallback, restore_last_checkpoint

    checkpoint = ctx().checkpoint
    last = restore_last_checkpoint(checkpoint, output_dir=args.output_dir)   # None on a first attempt
    trainer = Trainer(model, args, train_dataset=data, callbacks=[MirrorOutputDirCallback(checkpoint)])
    trainer.train(resume_from_checkpoint=last)

The callback saves with :meth:`~flyte_checkpoint.Checkpoint.save_sync` on purpose: ``Trainer``
calls its callbacks synchronously from the training loop, even when the task around it is
``async def``, so there is no event loop to await on; and the upload has to be complete before
training moves on, or a crash right after "checkpoint saved" could leave the previous object.

Preemption: at the end of the first optimizer step after a notice (SIGTERM, once the runners or
:func:`~flyte_checkpoint.preemption.install_preemption_handler` installed the handler), the
callback has ``Trainer`` write ``checkpoint-<step>`` of that step, saves the output directory,
stops training, and ends ``trainer.train()`` with :class:`~flyte_checkpoint.errors.Preempted`,
which the runners count as a preemption; the retry resumes from that step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.integrations._mirror import DirectoryMirror
from flyte_checkpoint.integrations._preemption import (
    OnPreemption,
    check_on_preemption,
    preempted_exit,
    preemption_save,
)
from flyte_checkpoint.integrations._restore import replace_contents, restore_directory
from flyte_checkpoint.preemption import notice, ranks
from flyte_checkpoint.single.checkpoint import BaseCheckpoint

__all__ = ["MirrorOutputDirCallback", "restore_last_checkpoint"]

# Untyped upstream: the newest ``checkpoint-<step>`` folder directly under a directory, or None.
_get_last_checkpoint: Callable[[str], str | None] = get_last_checkpoint


class MirrorOutputDirCallback(TrainerCallback):
    """Save ``Trainer``'s output directory to ``checkpoint`` after every checkpoint it writes.

    ``on_save`` runs once the ``checkpoint-<step>`` folder is complete and old ones are rotated
    out, so the saved checkpoint always holds whole checkpoints. Only the main process
    (``state.is_world_process_zero``) uploads. ``output_dir`` defaults to
    ``TrainingArguments.output_dir``.

    With ``incremental=True`` (the default) each save uploads only the files no earlier save
    stored, so a save costs the new ``checkpoint-<step>``, not the whole directory, and the chunks
    of checkpoints rotated out (``save_total_limit``) are collected; the checkpoint is then a
    manifest that flyte_checkpoint loads and the Flyte SDK cannot (see
    :mod:`flyte_checkpoint.incremental`).
    ``incremental=False`` saves one ``.tar.gz`` of the directory each time.

    After a preemption notice, at the next step end, the callback asks ``Trainer`` for a
    checkpoint of that step (``control.should_save``, whatever the save strategy; no evaluation)
    and to stop (``control.should_training_stop``); the directory is saved as usual once the
    checkpoint is written (bounded by the save deadline; a save that cannot commit in time is
    logged and the previous checkpoint kept), and the other ranks wait for that upload at the end
    of training. Then:

    * ``on_preemption="raise"`` (the default): ``on_train_end`` raises
      :class:`~flyte_checkpoint.errors.Preempted`, so ``trainer.train()`` raises it and a task
      that only calls ``train()`` exits as preempted. Raised there, once the loop has stopped
      cleanly, not in the step hook: ``Trainer`` has no handler for an exception mid-loop.
    * ``on_preemption="stop"``: ``train()`` returns; the task then ends with
      ``if checkpoint.preempted: raise checkpoint.preemption()``.

    Under ``torch.distributed`` (DDP, FSDP, DeepSpeed) every rank votes at each step end
    (:func:`flyte_checkpoint.preemption.ranks.reached_preemption`, one small all-reduce), so a
    notice on one rank stops all of them at the same step. The notice is read from the start of
    training on, so the preemption handler's watcher leaves stopping to this callback.
    """

    def __init__(
        self,
        checkpoint: BaseCheckpoint,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        on_preemption: OnPreemption = "raise",
        incremental: bool = True,
    ) -> None:
        self.checkpoint = checkpoint
        self._mirror = DirectoryMirror(incremental=incremental)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.on_preemption = check_on_preemption(on_preemption)
        self.preempted_at: int | None = None
        """The global step training stopped at for a preemption notice, or ``None``."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.preempted_at = None
        notice.take_over()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.preempted_at is None and ranks.reached_preemption(state.global_step):
            self.preempted_at = state.global_step
            control.should_save = True
            control.should_evaluate = False
            control.should_training_stop = True

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.preempted_at is not None:  # the step's checkpoint is saved: no epoch-end save or evaluation
            control.should_save = False
            control.should_evaluate = False

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            return
        directory = self.output_dir if self.output_dir is not None else args.output_dir
        if directory is None:
            raise InvalidCheckpointInputError(
                "TrainingArguments.output_dir is not set; pass output_dir= to MirrorOutputDirCallback"
            )
        step = self.preempted_at
        with preemption_save(step) if step is not None else nullcontext():
            self._mirror.save(self.checkpoint, Path(directory))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.preempted_at is None:
            return
        ranks.wait_for_every_rank()  # for the main process's upload, so no rank exits first
        if self.on_preemption == "raise":
            raise preempted_exit(self.checkpoint, saver=state.is_world_process_zero, step=self.preempted_at)


def restore_last_checkpoint(
    checkpoint: BaseCheckpoint, *, output_dir: str | os.PathLike[str] | None = None
) -> str | None:
    """Restore the previous attempt's output directory; return its newest ``checkpoint-<step>``.

    Pass the result to ``trainer.train(resume_from_checkpoint=...)``; ``None`` means there is
    nothing to resume, and ``Trainer`` then starts from scratch. With ``output_dir`` (the
    ``TrainingArguments``'), the restored files replace that directory's contents first, so
    checkpoint rotation (``save_total_limit``) carries on over the earlier checkpoints; without
    it, the path points into the checkpoint's workspace. The newest checkpoint is found with
    ``transformers.trainer_utils.get_last_checkpoint``.

    Raises:
        InvalidCheckpointInputError: the previous checkpoint is a single object (``payload``),
            not a directory, so it was not written by :class:`MirrorOutputDirCallback`.
    """
    restored = restore_directory(
        checkpoint,
        not_a_directory="not a Trainer output directory; save the output directory "
        "(MirrorOutputDirCallback does)",
    )
    if restored is None:
        return None
    root = restored
    if output_dir is not None:
        root = replace_contents(Path(output_dir).expanduser().absolute(), restored)
    return _get_last_checkpoint(str(root))
