"""PyTorch Lightning: mirror ``ModelCheckpoint``'s directory to a checkpoint, and resume from it.

Install with ``pip install torch==2.13.0`` (or any build you prefer) then
``pip install '.[lightning]'``::

    from flyte_checkpoint import ctx
    from flyte_checkpoint.integrations.lightning import MirroredModelCheckpoint, restore_last_checkpoint

    checkpoint = ctx().checkpoint
    last = restore_last_checkpoint(checkpoint, dirpath="checkpoints")    # None on the first attempt
    mirror = MirroredModelCheckpoint(checkpoint, dirpath="checkpoints", save_last=True)
    trainer = L.Trainer(callbacks=[mirror])
    trainer.fit(model, data, ckpt_path=last)

The callback saves with :meth:`~flyte_checkpoint.Checkpoint.save_sync` on purpose: Lightning calls
its hooks synchronously, from the training loop, even when the task around it is ``async def``, so
there is no event loop to await on; and the upload has to be complete before training moves on,
or a crash right after "checkpoint saved" could leave the previous object in place.

Preemption: at the end of the first training batch after a notice (SIGTERM, once the runners or
:func:`~flyte_checkpoint.preemption.install_preemption_handler` installed the handler), the
callback writes ``last.ckpt`` of that step, saves the directory, and ends ``fit`` with
:class:`~flyte_checkpoint.errors.Preempted`, which the runners count as a preemption; the retry
resumes from that step. Under DDP the ranks vote at each batch end through the strategy's
all-reduce, so all of them stop at the same step even when one alone got the signal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.integrations._mirror import DirectoryMirror
from flyte_checkpoint.integrations._preemption import (
    OnPreemption,
    check_on_preemption,
    preempted_exit,
    preemption_save,
)
from flyte_checkpoint.integrations._restore import replace_contents, restore_directory
from flyte_checkpoint.newest_file import latest_checkpoint
from flyte_checkpoint.preemption import handler, notice, ranks
from flyte_checkpoint.single.checkpoint import BaseCheckpoint

__all__ = ["MirroredModelCheckpoint", "restore_last_checkpoint"]

LAST_CHECKPOINT_GLOB = "**/last.ckpt"

_Fingerprint = frozenset[tuple[str, int, int, int]]


def _fingerprint(directory: Path) -> _Fingerprint:
    """Every entry under ``directory`` as (relative path, inode, mtime, size): changes on any write.

    The inode catches a file replaced by rename within one clock tick, which Lightning's atomic
    checkpoint writes do; a missing directory has an empty fingerprint.
    """
    entries: set[tuple[str, int, int, int]] = set()
    pending = [directory]
    while pending:
        current = pending.pop()
        try:
            scan = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in scan:
            info = entry.stat(follow_symlinks=False)
            entries.add((os.path.relpath(entry.path, directory), info.st_ino, info.st_mtime_ns, info.st_size))
            if entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
    return frozenset(entries)


def _local_directory(dirpath: str | os.PathLike[str]) -> Path:
    text = os.fspath(dirpath)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        raise InvalidCheckpointInputError(
            f"dirpath {text!r} must be a local directory: the callback mirrors it to the checkpoint's "
            "own destination, so point dirpath at local disk and the checkpoint at remote storage"
        )
    return Path(text).expanduser().absolute()


class MirroredModelCheckpoint(ModelCheckpoint):
    """A :class:`~lightning.pytorch.callbacks.ModelCheckpoint` that saves ``dirpath`` to ``checkpoint``.

    After each of ``ModelCheckpoint``'s own checkpoint cycles (end of a training batch, a training
    epoch, validation, training, or an exception) that changed anything on disk under ``dirpath``,
    the whole directory is saved as this attempt's checkpoint, so a retry restores exactly the
    files Lightning wrote, top-k and ``last.ckpt`` alike. Only the global rank 0 process uploads.
    With ``incremental=True`` (the default) a save uploads only the files no earlier save stored
    and collects the chunks of checkpoints rotated out (the checkpoint is then a manifest that
    flyte_checkpoint loads and the Flyte SDK cannot, see :mod:`flyte_checkpoint.incremental`);
    ``incremental=False`` saves one ``.tar.gz`` each time. Every other argument is
    ``ModelCheckpoint``'s.

    Saving uses ``save_sync``: Lightning's hooks are synchronous even inside an ``async def`` task.

    After a preemption notice, at the next training batch end, every rank writes ``last.ckpt`` of
    the current step (the file ``save_last=True`` keeps: keep that on, so later saves replace it),
    rank 0 saves the directory while the others wait for it (bounded by the save deadline; a save
    that cannot commit in time is logged and the previous checkpoint kept), ``trainer.should_stop``
    is set, and then:

    * ``on_preemption="raise"`` (the default): the hook raises
      :class:`~flyte_checkpoint.errors.Preempted`; Lightning calls ``on_exception`` and tears
      down as for any interruption, and ``trainer.fit`` raises it, so a task that only calls
      ``fit`` exits as preempted. Raised at once rather than after ``fit``: with ``should_stop``
      set Lightning still runs a whole validation loop, and ignores it until ``min_epochs`` and
      ``min_steps`` are met; a grace period has time for neither.
    * ``on_preemption="stop"``: ``fit`` returns (after that validation, if any); the task then
      ends with ``if checkpoint.preempted: raise checkpoint.preemption()``.

    Every rank takes the decision together (:mod:`flyte_checkpoint.preemption.ranks`): a vote at
    each batch end through ``trainer.strategy.reduce`` (one small all-reduce under DDP, nothing on
    one device), so a notice on one rank stops all of them at the same step and no rank waits in
    a collective the others left. During training the preemption handler is kept on its signals:
    the SIGTERM handler ``fit`` installs logs and, under DDP, broadcasts inside the signal handler
    (which deadlocks the ranks that did not get the signal); ``fit`` puts ours back when it ends.
    The notice is read from the start of training on, so the handler's watcher leaves stopping
    to this callback instead of ending the main thread under Lightning.
    """

    def __init__(
        self,
        checkpoint: BaseCheckpoint,
        *,
        dirpath: str | os.PathLike[str],
        on_preemption: OnPreemption = "raise",
        incremental: bool = True,
        **kwargs: Any,
    ) -> None:
        local = _local_directory(dirpath)
        super().__init__(dirpath=str(local), **kwargs)
        self.checkpoint = checkpoint
        self._mirror = DirectoryMirror(incremental=incremental)
        self.mirrored_directory = local
        self.on_preemption = check_on_preemption(on_preemption)
        self.preempted_at: int | None = None
        """The global step training stopped at for a preemption notice, or ``None``."""

    @contextmanager
    def _mirroring(self, trainer: pl.Trainer) -> Iterator[None]:
        before = _fingerprint(self.mirrored_directory)
        yield
        if trainer.is_global_zero and _fingerprint(self.mirrored_directory) != before:
            self.mirror()

    def mirror(self) -> None:
        """Save the checkpoint directory now (blocking); a no-op while it does not exist yet."""
        if self.mirrored_directory.is_dir():
            self._mirror.save(self.checkpoint, self.mirrored_directory)

    @override
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_sanity_check_start(trainer, pl_module)
        handler.reclaim_signals()  # fit installed its SIGTERM handler just before

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self.preempted_at = None
        handler.reclaim_signals()
        notice.take_over()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        with self._mirroring(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.preempted_at is None and _ranks_reached_preemption(trainer):
            self._stop_for_preemption(trainer)

    def _stop_for_preemption(self, trainer: pl.Trainer) -> None:
        step = self.preempted_at = trainer.global_step
        filepath = self.format_checkpoint_name(self._monitor_candidates(trainer), self.CHECKPOINT_NAME_LAST)
        if trainer.is_global_zero and os.path.islink(filepath):
            os.remove(filepath)  # save_last="link": write a file, never through the link into a top-k one
        with preemption_save(step), self._mirroring(trainer):
            self.last_model_path = filepath
            self._save_checkpoint(trainer, filepath)
        # Rank 0 uploads; the others wait for it, so none exits first (torchrun would then stop rank 0).
        trainer.strategy.barrier("flyte_checkpoint: preemption save")
        trainer.should_stop = True
        if self.on_preemption == "raise":
            raise preempted_exit(self.checkpoint, saver=trainer.is_global_zero, step=step)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with self._mirroring(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with self._mirroring(trainer):
            super().on_validation_end(trainer, pl_module)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        with self._mirroring(trainer):
            super().on_exception(trainer, pl_module, exception)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        with self._mirroring(trainer):
            super().on_train_end(trainer, pl_module)


def _ranks_reached_preemption(trainer: pl.Trainer) -> bool:
    """The ranks' vote at this batch end, through the strategy's all-reduce (it knows the group
    and the device); on one device, this process's notice alone."""
    step = trainer.global_step
    vote = ranks.ballot(step)
    if trainer.world_size > 1:
        tensor = torch.tensor(vote, dtype=torch.float64, device=trainer.strategy.root_device)
        vote = trainer.strategy.reduce(tensor, reduce_op="min").tolist()
    return ranks.count(vote, step)


def restore_last_checkpoint(
    checkpoint: BaseCheckpoint,
    *,
    dirpath: str | os.PathLike[str] | None = None,
    glob_pattern: str = LAST_CHECKPOINT_GLOB,
) -> Path | None:
    """Restore the previous attempt's directory; return its newest ``last.ckpt`` (``None`` if none).

    Pass the result to ``trainer.fit(..., ckpt_path=...)``. With ``dirpath`` (the callback's),
    the restored files replace that directory's contents first, so Lightning carries on with its
    top-k files and its ``last.ckpt`` where it left them; without it, the path points into the
    checkpoint's workspace. ``None`` means there is nothing to resume: start from scratch.

    Raises:
        InvalidCheckpointInputError: the previous checkpoint is a single object (``payload``),
            not a directory, so it was not written by :class:`MirroredModelCheckpoint`.
    """
    restored = restore_directory(
        checkpoint,
        not_a_directory="not a directory of Lightning checkpoints; save the ModelCheckpoint "
        "directory (MirroredModelCheckpoint does)",
    )
    if restored is None:
        return None
    root = restored if dirpath is None else replace_contents(_local_directory(dirpath), restored)
    return latest_checkpoint(root, glob_pattern)
