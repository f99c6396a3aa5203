"""How the state package reports failures, built in one place.

A failing part is a :class:`CheckpointPartError` (with its ``position``), a bounded wait that ran
out a :class:`CheckpointTimeoutError`; errors of this package that already have a precise class
keep it, with the part named in a note.
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


def in_context(exc: BaseException, position: int | None, consequence: str) -> BaseException:
    """``exc`` with the failing part named.

    This package's errors keep their class and identity, so callers can still catch
    ``PermissionError``, ``CheckpointCorruptError`` and the like: the part and the consequence
    are added as a note (a part error that names its part already is returned as is). Anything
    else becomes a :class:`CheckpointPartError`, which the caller chains to ``exc``.
    """
    label = label_of(position)
    if isinstance(exc, CheckpointPartError) and exc.position == position:
        return exc
    if isinstance(exc, CheckpointError):
        _add_note(exc, f"{label} failed; {consequence}")
        return exc
    return CheckpointPartError(f"{label} failed: {describe_exception(exc)}; {consequence}", position=position)


def _add_note(exc: BaseException, note: str) -> None:
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(note)
    else:  # Python 3.10: kept where 3.11's tracebacks and callers find notes
        setattr(exc, "__notes__", [*getattr(exc, "__notes__", []), note])  # noqa: B010
