"""How the state package reports failures, built in one place.

errors.py has no class yet for "a part failed" or "a bounded wait ran out", so both are plain
:class:`CheckpointError` with the part and the cause in the message; should dedicated classes be
added, only these functions change.
"""

from __future__ import annotations

from flyte_checkpoint.errors import CheckpointError
from flyte_checkpoint.state.components import describe_exception


def label_of(position: int | None) -> str:
    """``"part 3"``, or ``"the controller"`` for the coordinator's own state."""
    return "the controller" if position is None else f"part {position}"


def part_failed(position: int | None, cause: str, consequence: str) -> CheckpointError:
    """A part (or the controller) could not be written, read or applied."""
    return CheckpointError(f"{label_of(position)} failed: {cause}; {consequence}")


def timed_out(message: str) -> CheckpointError:
    """A bounded wait (for parts, a lock, storage) ran out."""
    return CheckpointError(message)


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
    if isinstance(exc, CheckpointError):
        try:
            return type(exc)(message)
        except TypeError:
            pass
    return CheckpointError(message)
