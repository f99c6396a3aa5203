"""What the mirror callbacks share: saving the framework's directory, incrementally by default."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flyte_checkpoint.single.checkpoint import BaseCheckpoint, Checkpoint

logger = logging.getLogger("flyte_checkpoint")


class DirectoryMirror:
    """Saves one directory to ``checkpoint`` each time the framework wrote into it.

    With ``incremental`` (the callbacks' default) a save uploads only the files no earlier save
    of the checkpoint stored (:mod:`flyte_checkpoint.incremental`): a ``Trainer`` output
    directory costs the new ``checkpoint-N`` per save, not the whole directory again. When an
    entry the previous save held is gone (the framework rotated an old checkpoint out), the
    chunks no live checkpoint references any more are collected after the save, as
    :meth:`Checkpoint.collect_garbage_sync` does (a chunk is deleted by the first collection
    a grace period after the one that found it unreferenced, so at a later rotation); a failed
    collection is logged, never raised into training.
    """

    def __init__(self, *, incremental: bool) -> None:
        self.incremental = incremental
        self._saved_entries: set[str] | None = None

    def save(self, checkpoint: BaseCheckpoint, directory: Path) -> None:
        """Save ``directory`` (blocking), then collect garbage if entries were removed."""
        entries = set(os.listdir(directory))
        checkpoint.save_sync(directory, incremental=self.incremental)
        removed = self._saved_entries is not None and bool(self._saved_entries - entries)
        self._saved_entries = entries
        if self.incremental and removed and isinstance(checkpoint, Checkpoint):
            try:
                checkpoint.collect_garbage_sync()
            except Exception as error:
                logger.warning("could not remove unreferenced chunks of %s: %s", directory, error)
