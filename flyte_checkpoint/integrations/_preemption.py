"""What the framework callbacks share once their ranks agreed to stop for a preemption notice."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from flyte_checkpoint.errors import CheckpointError, ConfigurationError, Preempted
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.single.checkpoint import BaseCheckpoint, Checkpoint

logger = logging.getLogger("flyte_checkpoint")

OnPreemption = Literal["raise", "stop"]
"""``"raise"``: the run ends with :class:`~flyte_checkpoint.errors.Preempted` out of the framework's
training call; ``"stop"``: that call returns, and the task raises ``checkpoint.preemption()``."""


def check_on_preemption(value: object) -> OnPreemption:
    if value == "raise":
        return "raise"
    if value == "stop":
        return "stop"
    raise ConfigurationError(
        f'on_preemption must be "raise" (the training call raises Preempted) or "stop" (it returns, '
        f"and the task raises checkpoint.preemption()), not {value!r}"
    )


@contextmanager
def preemption_save(step: int) -> Iterator[None]:
    """Around the save a notice caused: one that cannot commit (no time left, storage down) is
    logged and the run still stops; the exit then says that nothing committed after the notice."""
    try:
        yield
    except CheckpointError as exc:
        logger.warning(
            "the checkpoint of step %d after the preemption notice did not commit; training stops "
            "anyway, and the next attempt resumes from the previous checkpoint: %s",
            step,
            exc,
        )


def preempted_exit(checkpoint: BaseCheckpoint, *, saver: bool, step: int) -> Preempted:
    """The exception a rank stopped at ``step`` ends with; the saving rank's says if its save committed."""
    if saver and isinstance(checkpoint, Checkpoint):
        return checkpoint.preemption()
    current = notice.current_notice()
    if current is None:  # the vote records the notice on every rank; only a runner's clear() undoes it
        raise RuntimeError("no preemption notice is recorded; the run did not stop for one")
    detail = f"training stopped at step {step} on every rank" + (
        "" if saver else "; the main process saved the checkpoint"
    )
    return notice.preempted_exit(current, detail=detail)
