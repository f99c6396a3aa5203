"""The one time-bound value of the package: a moment on the monotonic clock, and what it is.

A multi-part save's waits share one (:mod:`flyte_checkpoint.state.waiting`), a preemption
notice sets one for every save made after it (:func:`flyte_checkpoint.preemption.notice.save_deadline`),
and the storage layer stops an operation that would run past the one in force
(:func:`flyte_checkpoint.storage.deadline.finish_by`). Only the storage layer's per-transfer
bound, which grows with the bytes moved and cancels tasks on a store's loop, is a class of its own
(:class:`flyte_checkpoint.storage.deadline.TransferBound`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from flyte_checkpoint.errors import CheckpointTimeoutError


@dataclass(frozen=True)
class Deadline:
    """A ``time.monotonic()`` moment something must be done by. Make one with :meth:`after` or
    :meth:`until`."""

    at: float
    """The moment, on the ``time.monotonic()`` clock."""
    seconds: float
    """How long it allowed when it was set (for messages: "did not finish within 600 s")."""
    reason: str = "the deadline"
    """What the moment is, for errors: "the save deadline of the preemption notice (...)"."""
    error_type: type[CheckpointTimeoutError] = CheckpointTimeoutError
    """What an operation stopped by it raises."""

    @classmethod
    def after(
        cls,
        seconds: float,
        *,
        reason: str = "the deadline",
        error_type: type[CheckpointTimeoutError] = CheckpointTimeoutError,
    ) -> Deadline:
        """The moment ``seconds`` from now."""
        return cls(time.monotonic() + seconds, seconds, reason, error_type)

    @classmethod
    def until(
        cls,
        instant: float,
        *,
        reason: str = "the deadline",
        error_type: type[CheckpointTimeoutError] = CheckpointTimeoutError,
    ) -> Deadline:
        """The moment ``instant`` (a ``time.monotonic()`` value)."""
        return cls(instant, max(0.0, instant - time.monotonic()), reason, error_type)

    def remaining(self) -> float:
        """Seconds left before the moment; ``0.0`` once it passed."""
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        """Whether the moment has passed."""
        return time.monotonic() >= self.at
