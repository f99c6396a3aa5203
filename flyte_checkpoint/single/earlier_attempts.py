"""Resume from the newest attempt that saved, not only from the one just before.

An attempt that dies before its first save leaves the next attempt's previous checkpoint absent
(flyte#2894), and training would start over although an earlier attempt had saved. When the
previous checkpoint is absent or empty and its URI follows a per-attempt layout
(:func:`~flyte_checkpoint.uris.attempt_uris`), :func:`restore_newest` looks at the same
checkpoint of up to :data:`MAX_WALK_BACK` earlier attempts, newest first, with one metadata
request each before reading, and restores the first sound one.

What each kind of failure means on the way:

* absent or empty: that attempt did not save; the next older one is tried.
* damaged (:class:`CheckpointCorruptError`): skipped with a WARNING naming it, so a damaged
  checkpoint does not fail every later attempt too; when every attempt that saved is damaged,
  the error is raised, naming them.
* anything else (storage unreachable after retries, permissions, a timeout): raised at once.
  "Storage is down" never reads as "this attempt did not save".

Earlier attempts are also where a killed save's unfinished upload stays (an incomplete S3
multipart upload, GCS temporary part objects): no later save goes to their keys, so the
stale-upload sweep of a save never meets it. :func:`discard_earlier_uploads` removes those of
the same earlier attempts when the next attempt starts: those attempts have ended (a retry
starts only after its attempt failed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import CheckpointCorruptError, add_context
from flyte_checkpoint.single.transfer import holds_checkpoint
from flyte_checkpoint.storage import Backend
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.uris import AttemptURI, attempt_uris

logger = logging.getLogger("flyte_checkpoint")

__all__ = ["MAX_WALK_BACK", "RestoredFrom", "discard_earlier_uploads", "restore_newest"]

MAX_WALK_BACK = 16
"""How many attempts before the previous one a load looks at, at most (one request each)."""


class RestoredFrom(BaseModel):
    """Where a load restored the checkpoint from (:attr:`Checkpoint.restored_from`)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    """The object that was restored: the previous checkpoint, or an earlier attempt's."""
    attempt: int | None
    """The attempt directory ``n`` of :attr:`uri` (``…/{run}/{action}/{n}/…``; on Flyte it counts
    from 1, so it is the saving attempt's 0-based ``attempt_number`` + 1); ``None`` when the
    URI has no attempt directory."""


def restore_newest(
    backend: Backend,
    candidates: Sequence[AttemptURI],
    load: Callable[[str], Path | None],
    *,
    retry: RetryPolicy,
) -> tuple[Path, RestoredFrom] | None:
    """Restore the first of ``candidates`` (newest first) holding a sound checkpoint.

    ``load(uri)`` restores one object (``None`` when there is none). With one candidate this is
    just ``load``. With more, each is first looked up (``backend.info``, retried as ``retry``
    says); absent, empty and damaged ones are passed over as the module docstring says.
    Returns the restored path and where it came from, or ``None`` when no attempt saved.
    """
    if len(candidates) == 1:
        (only,) = candidates
        path = load(only.uri)
        return None if path is None else (path, RestoredFrom(uri=only.uri, attempt=only.attempt))
    passed_over: list[str] = []
    damaged: list[tuple[AttemptURI, CheckpointCorruptError]] = []
    for position, candidate in enumerate(candidates):
        try:
            restored, nothing = _restore_one(backend, candidate.uri, load, retry)
        except CheckpointCorruptError as exc:
            damaged.append((candidate, exc))
            passed_over.append(f"attempt {candidate.attempt}: damaged")
            older = candidates[position + 1].attempt if position + 1 < len(candidates) else None
            logger.warning(
                "checkpoint of attempt %s at %s is damaged (%s); skipping it, %s",
                candidate.attempt,
                candidate.uri,
                exc,
                f"trying attempt {older}" if older is not None else "no earlier attempt is left to try",
            )
            continue
        if restored is None:
            passed_over.append(f"attempt {candidate.attempt}: {nothing}")
            continue
        if position:
            logger.info(
                "no checkpoint at attempt %s (%s); resuming from attempt %s at %s",
                candidates[0].attempt,
                ", ".join(passed_over),
                candidate.attempt,
                candidate.uri,
            )
        return restored, RestoredFrom(uri=candidate.uri, attempt=candidate.attempt)
    if damaged:
        raise _all_damaged(damaged)
    logger.info(
        "no checkpoint at attempt %s nor at the %d attempts before it (%s, the last at %s); starting fresh",
        candidates[0].attempt,
        len(candidates) - 1,
        ", ".join(passed_over),
        candidates[-1].uri,
    )
    return None


def _restore_one(
    backend: Backend, uri: str, load: Callable[[str], Path | None], retry: RetryPolicy
) -> tuple[Path | None, str]:
    """The restored path, or ``None`` and why there was nothing to restore at ``uri``."""
    info = retry.call(lambda: backend.info(uri), describe=f"looking up {uri}")
    if info is None:
        return None, "no object"
    if not holds_checkpoint(info):
        return None, "empty"
    return load(uri), "no object"  # None only if it was removed since it was looked up


def _all_damaged(damaged: list[tuple[AttemptURI, CheckpointCorruptError]]) -> CheckpointCorruptError:
    """The error for a walk on which every attempt that saved had a damaged checkpoint."""
    if len(damaged) == 1:
        ((candidate, error),) = damaged
        add_context(error, "no other attempt within reach saved a checkpoint", uri=candidate.uri)
        return error
    names = "; ".join(
        f"attempt {candidate.attempt} at {candidate.uri} ({error})" for candidate, error in damaged
    )
    combined = CheckpointCorruptError(
        f"no sound checkpoint to resume from: the checkpoint of every attempt that saved one is "
        f"damaged: {names}; delete them to start fresh or point the source at a sound copy"
    )
    combined.__cause__ = damaged[0][1]
    return combined


_discarded_for: set[str] = set()
"""Destinations whose earlier attempts' uploads this process discards (or discarded): once each."""
_discarded_lock = threading.Lock()


def discard_earlier_uploads(
    backend: Backend, dest: str, *, run_name: str | None, action_name: str | None
) -> threading.Thread | None:
    """Abort, in a background thread, the unfinished uploads earlier attempts left at their keys.

    ``dest`` is this attempt's checkpoint; when it follows a per-attempt layout
    (:func:`~flyte_checkpoint.uris.attempt_uris`), the same checkpoint of up to
    :data:`MAX_WALK_BACK` attempts before it is cleaned, where the store keeps such uploads
    (:attr:`Backend.keeps_unfinished_uploads`). Their committed checkpoints stay. Once per
    process and destination; best effort, one request or two per attempt: what fails is logged
    at DEBUG (a later attempt tries again, and a bucket lifecycle rule is the backstop).
    Returns the thread, or ``None`` when there is nothing to do.
    """
    if not backend.keeps_unfinished_uploads:
        return None
    earlier = attempt_uris(dest, run_name=run_name, action_name=action_name, earlier=MAX_WALK_BACK)[1:]
    if not earlier:
        return None
    with _discarded_lock:
        if dest in _discarded_for:
            return None
        _discarded_for.add(dest)

    def discard() -> None:
        for candidate in earlier:
            try:
                count = backend.discard_unfinished_uploads(candidate.uri)
            except Exception as exc:
                logger.debug("could not discard the unfinished uploads to %s: %s", candidate.uri, exc)
                continue
            if count:
                logger.info(
                    "discarded %d unfinished upload(s) attempt %s left at %s",
                    count,
                    candidate.attempt,
                    candidate.uri,
                )

    thread = threading.Thread(target=discard, name="flyte-checkpoint-earlier-uploads", daemon=True)
    thread.start()
    return thread
