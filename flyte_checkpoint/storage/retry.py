"""Bounded retries with exponential backoff and full jitter, for transient storage failures.

The retry budget, and where it lives. Retries happen at exactly two layers, each bounded:

1. **One request**, inside the store's client: :data:`REQUEST_ATTEMPTS` tries of one HTTP
   request -- botocore's ``max_attempts`` (standard mode), Azure's ``retry_total``
   (``REQUEST_ATTEMPTS - 1`` retries). This layer retries without re-sending what a multipart
   upload already sent. gcsfs retries its own calls (info, listings, deletes) with a fixed
   policy it offers no switch for; that is the one exception.

   Parallel transfers (:mod:`.parallel`: the saves and loads of every object store) retry each
   part or range on its own, ``part_attempts`` times (storage option, default
   :data:`REQUEST_ATTEMPTS`). On S3 and Azure they add nothing to the client's count: a request
   botocore or the Azure SDK already retried fails at once
   (:func:`~.parallel.retries.mark_retried_by_client`), so ``part_attempts`` covers only a response
   body that broke off mid-way (neither client retries a body once it is streaming). GCS part
   and range requests bypass gcsfs's loop, so ``part_attempts`` is their only per-request layer.
2. **One transfer**, in :mod:`flyte_checkpoint.single.transfer`: :class:`RetryPolicy` around a whole
   save or load, the only layer that can start a stream over (an upload cannot be resumed, a
   load whose object was replaced must be read again from its start).

Nothing else retries: s3fs's own retry loop, which repeats botocore's, is off (its ``retries``
is 1 unless a caller sets it). So a failing S3 operation makes at most ``RetryPolicy.attempts x
REQUEST_ATTEMPTS`` tries of the failing request (15 with the defaults), each bounded by the
store's connect and read timeouts, with at most ``RetryPolicy.max_total_delay()`` seconds of
back-off between transfers. Each transfer attempt is also bounded as a whole by its deadline
(storage option ``transfer_timeout``, see :mod:`.deadline`); a transfer that runs out of it
raises :class:`~flyte_checkpoint.errors.CheckpointTimeoutError`, which is not retried.
"""

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

REQUEST_ATTEMPTS = 3
"""Tries of one request inside a store's client, the first included (see the module docstring)."""


class RetryPolicy(BaseModel):
    """How often, and how patiently, a transient storage failure is retried.

    Only :class:`CheckpointUnavailableError` (connection refused or reset, timeouts, throttling,
    5xx) is retried; everything else fails at once. With the defaults a failing operation gives
    up after 5 attempts and at most 3.75 s of waiting (:meth:`max_total_delay`). This is the
    per-transfer layer of the one retry budget described at the top of this module.
    """

    model_config = ConfigDict(frozen=True)

    attempts: int = Field(default=5, ge=1)
    """Total tries, the first included."""
    initial_delay: float = Field(default=0.25, ge=0)
    """Upper bound of the first wait, in seconds; each later bound doubles."""
    max_delay: float = Field(default=4.0, ge=0)
    """Cap on any single wait, in seconds."""

    def max_total_delay(self) -> float:
        """The most a failing operation can spend waiting between its attempts, in seconds."""
        return sum(self._bound(retry) for retry in range(1, self.attempts))

    def delay(self, retry: int) -> float:
        """A random wait for the ``retry``-th retry (1-based): full jitter below the doubled bound."""
        return random.uniform(0, self._bound(retry))

    def _bound(self, retry: int) -> float:
        return min(self.max_delay, self.initial_delay * 2.0 ** (retry - 1))

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
