"""The retries of one part or range request on the store's loop, and the mark that says the store's
client already spent its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from flyte_checkpoint.errors import InputChangedError
from flyte_checkpoint.storage.errors import classify
from flyte_checkpoint.storage.parallel.contract import ObjectReplacedError
from flyte_checkpoint.storage.retry import RetryPolicy

logger = logging.getLogger("flyte_checkpoint")
T = TypeVar("T")

# -- running coroutines on the store's loop ---------------------------------------------------
# Every coroutine goes to the store's loop through :meth:`TransferBound.submit`, and every wait for
# one through :meth:`TransferBound.result` / :meth:`TransferBound.wait_any`: nothing waits unbounded.


_RETRIED_BY_CLIENT = "_flyte_checkpoint_retried_by_client"


def mark_retried_by_client(exc: BaseException) -> None:
    """Say that the store's client already spent its own retries on the request that raised ``exc``.

    Store adapters call this for errors of requests their client retries (botocore's
    ``max_attempts``, Azure's ``retry_total``): the part layer then does not repeat them, so the
    retries of one request do not multiply (see :mod:`.retry`).
    """
    setattr(exc, _RETRIED_BY_CLIENT, True)


async def with_retries(policy: RetryPolicy, describe: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()``, retried on transient failures within ``policy``'s budget.

    Failures the client already retried (:func:`mark_retried_by_client`) are raised at once.
    """
    for tries in range(1, policy.attempts + 1):
        try:
            return await attempt()
        except (ObjectReplacedError, InputChangedError):
            raise  # another try meets the same replacement or changed file: nothing to retry
        except Exception as exc:
            retried = getattr(exc, _RETRIED_BY_CLIENT, False)
            if retried or classify(exc) != "transient" or tries == policy.attempts:
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(f"{describe}: gave up after {tries} attempt(s)")
                raise
            wait = policy.delay(tries)
            logger.debug("%s failed (%s); retry %d in %.2f s", describe, exc, tries, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
