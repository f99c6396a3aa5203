"""What the framework integrations share: restoring a saved directory where the framework wants it."""

from __future__ import annotations

import shutil
from pathlib import Path

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.single.checkpoint import BaseCheckpoint
from flyte_checkpoint.tree_removal import remove_tree


def restore_directory(checkpoint: BaseCheckpoint, *, not_a_directory: str) -> Path | None:
    """Load the previous attempt's directory into the workspace (``None``: nothing to resume).

    A previous checkpoint that is a single object raises :class:`InvalidCheckpointInputError`,
    completed by ``not_a_directory`` (what was expected, and what saves it).
    """
    restored = checkpoint.load_sync()
    if restored is not None and not restored.is_dir():
        raise InvalidCheckpointInputError(
            f"the previous checkpoint restored as a single object ({restored}), {not_a_directory}"
        )
    return restored


def replace_contents(target: Path, restored: Path) -> Path:
    """Make ``target`` a copy of ``restored`` (the framework's own directory, so its rotation of
    older checkpoints carries on where it left off); return ``target``."""
    if target.exists():
        remove_tree(str(target))
    shutil.copytree(restored, target, symlinks=True)
    return target
