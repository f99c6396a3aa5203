"""PyTorch Lightning: mirror ``ModelCheckpoint``'s directory to a checkpoint, and resume from it.

Install with ``pip install torch==2.13.0`` (or any build you prefer) then
``pip install 'flyte-checkpoint[lightning]'``::

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
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from flyte_checkpoint.checkpoint import BaseCheckpoint
from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.integrations._restore import replace_contents, restore_directory
from flyte_checkpoint.latest import latest_checkpoint

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
    the whole directory is saved as this attempt's checkpoint object (one ``.tar.gz``), so a retry
    restores exactly the files Lightning wrote, top-k and ``last.ckpt`` alike. Only the global
    rank 0 process uploads. Every other argument is ``ModelCheckpoint``'s.

    Saving uses ``save_sync``: Lightning's hooks are synchronous even inside an ``async def`` task.
    """

    def __init__(self, checkpoint: BaseCheckpoint, *, dirpath: str | os.PathLike[str], **kwargs: Any) -> None:
        local = _local_directory(dirpath)
        super().__init__(dirpath=str(local), **kwargs)
        self.checkpoint = checkpoint
        self.mirrored_directory = local

    @contextmanager
    def _mirroring(self, trainer: pl.Trainer) -> Iterator[None]:
        before = _fingerprint(self.mirrored_directory)
        yield
        if trainer.is_global_zero and _fingerprint(self.mirrored_directory) != before:
            self.mirror()

    def mirror(self) -> None:
        """Save the checkpoint directory now (blocking); a no-op while it does not exist yet."""
        if self.mirrored_directory.is_dir():
            self.checkpoint.save_sync(self.mirrored_directory)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        with self._mirroring(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

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
