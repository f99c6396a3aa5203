"""How the state package reports failures, built in one place.

A failing part is a :class:`CheckpointPartError` (with its ``position``), a bounded wait that ran
out a :class:`CheckpointTimeoutError`; errors of this package that already have a precise class
keep it, with the part named.
"""

from __future__ import annotations

from flyte_checkpoint.errors import CheckpointError, CheckpointPartError, CheckpointTimeoutError
from flyte_checkpoint.state.components import describe_exception


def label_of(position: int | None) -> str:
    """``"part 3"``, or ``"the controller"`` for the coordinator's own state."""
    return "the controller" if position is None else f"part {position}"


def part_failed(position: int | None, cause: str, consequence: str) -> CheckpointError:
    """A part (or the controller) could not be written, read or applied."""
    return CheckpointPartError(f"{label_of(position)} failed: {cause}; {consequence}", position=position)


def timed_out(message: str) -> CheckpointError:
    """A bounded wait (for parts, a lock, storage) ran out."""
    return CheckpointTimeoutError(message)


def in_context(exc: BaseException, position: int | None, consequence: str) -> CheckpointError:
    """``exc`` with the failing part named, keeping its class when it is one of ours.

    A :class:`CheckpointError` subclass is re-created with the extra context, so callers can
    still catch ``PermissionError``, ``CheckpointCorruptError`` and the like; anything else is
    wrapped. The caller chains the original with ``raise ... from exc``.
    """
    label = label_of(position)
    text = str(exc)
    # Errors raised by this package usually name the part already ("part 3 is damaged: ...").
    body = text if text.startswith(label) else f"{label} failed: {describe_exception(exc)}"
    message = f"{body}; {consequence}"
    if isinstance(exc, CheckpointError) and not isinstance(exc, CheckpointPartError):
        try:
            return type(exc)(message)
        except TypeError:
            pass
    return CheckpointPartError(message, position=position)
