"""Bounded retries with exponential backoff and full jitter, for transient storage failures."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from flyte_checkpoint.errors import CheckpointUnavailableError, add_context

logger = logging.getLogger("flyte_checkpoint")

T = TypeVar("T")


class RetryPolicy(BaseModel):
    """How often, and how patiently, a transient storage failure is retried.

    Only :class:`CheckpointUnavailableError` (connection refused or reset, timeouts, throttling,
    5xx) is retried; everything else fails at once. With the defaults a failing operation gives
    up after 5 attempts and at most about 10 s of waiting.
    """

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=5, ge=1)
    """Total tries, the first included."""
    initial_delay: float = Field(default=0.25, ge=0)
    """Upper bound of the first wait, in seconds; each later bound doubles."""
    max_delay: float = Field(default=4.0, ge=0)
    """Cap on any single wait, in seconds."""

    def delay(self, retry: int) -> float:
        """A random wait for the ``retry``-th retry (1-based): full jitter below the doubled bound."""
        bound = min(self.max_delay, self.initial_delay * (2 ** (retry - 1)))
        return random.uniform(0, bound)

    def call(
        self,
        operation: Callable[[], T],
        *,
        describe: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """Run ``operation``, retrying transient failures; the last one is raised with a note of the count."""
        for attempt in range(1, self.attempts + 1):
            try:
                return operation()
            except CheckpointUnavailableError as exc:
                if attempt == self.attempts:
                    add_context(
                        exc,
                        f"gave up {describe} after {attempt} attempts; the checkpoint may still "
                        "exist — check the storage endpoint and network, then retry",
                    )
                    raise
                wait = self.delay(attempt)
                logger.debug(
                    "%s failed (%s); retry %d of %d in %.2f s",
                    describe,
                    exc,
                    attempt,
                    self.attempts - 1,
                    wait,
                )
                sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover
