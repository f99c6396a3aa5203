"""Numbered steps, as both step managers keep them: one directory per step, ``step_<n>``.

:class:`flyte_checkpoint.state.CheckpointManager` (multi-part checkpoints) and
:class:`flyte_checkpoint.distributed.DistributedCheckpointManager` (DCP) name, check and report
steps the same way; the rules live here once so the two cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import InvalidCheckpointInputError

STEP_DIR_PREFIX = "step_"
"""What a step directory's name starts with; the step number follows (``step_1000``)."""

_STEP_DIR = re.compile(rf"^{STEP_DIR_PREFIX}(\d+)$")


class RestoredStep(BaseModel):
    """What a step manager's ``load`` restored, and from where."""

    model_config = ConfigDict(frozen=True)

    step: int
    version_id: str
    checkpoint_dir: str
    metadata: dict[str, Any]


def check_step(step: object) -> int:
    """``step`` if it is a non-negative ``int`` (not a ``bool``); else ``InvalidCheckpointInputError``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidCheckpointInputError(f"step must be a non-negative int, not {step!r}")
    return step


def step_dir_name(step: int) -> str:
    """The directory name of ``step`` under a manager's root."""
    return f"{STEP_DIR_PREFIX}{step}"


def step_of_dir_name(name: str) -> int | None:
    """The step a directory called ``name`` holds, or ``None`` when the name is no step's."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match is not None else None
