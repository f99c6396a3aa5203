"""The exceptions this package raises.

Every error is a :class:`CheckpointError`, and each one also subclasses the builtin that a caller
would naturally catch (``FileNotFoundError``, ``PermissionError``, ``ValueError`` ...), so code
written against plain Python exceptions keeps working.
"""

from __future__ import annotations

import sys
from typing import Any


class CheckpointError(Exception):
    """Base class of every error raised by ``flyte_checkpoint``."""

    uri: str | None = None
    """The checkpoint the error is about, when a caller further up knew it (:func:`add_context`);
    the message then names it."""

    def __str__(self) -> str:
        message = super().__str__()
        if self.uri is not None and self.uri not in message:
            return f"checkpoint {self.uri}: {message}"
        return message


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A path given to save, or a checkpoint asked for explicitly, does not exist."""


class CheckpointPermissionError(CheckpointError, PermissionError):
    """The storage refused access: missing or wrong credentials, or no permission on the path."""


class CheckpointUnavailableError(CheckpointError, ConnectionError):
    """The storage could not be reached, even after bounded retries; the checkpoint may exist."""


class CheckpointStorageError(CheckpointError, OSError):
    """The storage failed in a way that retrying will not fix (disk full, read-only, bad path)."""


class CheckpointCorruptError(CheckpointError, ValueError):
    """A stored checkpoint is damaged: truncated, altered, or not in the format it claims."""


class ArchiveIndexError(CheckpointCorruptError):
    """An indexed archive's members or index disagree with each other or with its content:
    it was truncated, altered or damaged after this package wrote it."""


class UnsafeArchiveError(CheckpointCorruptError):
    """An archive tried to write outside the workspace, or holds a forbidden member type."""


class UntrustedContentError(CheckpointCorruptError):
    """A stored part names code to run on loading (a pickle of something that is not state), and
    the serializer does not trust the store; nothing of it was run."""


class ArchiveLimitError(UnsafeArchiveError):
    """An archive exceeds the configured extraction limits (total bytes or member count)."""


class CheckpointPartError(CheckpointError, RuntimeError):
    """One part of a multi-part checkpoint (or its controller) failed to be written, read or applied.

    ``position`` is the part's position (``None`` for the controller); the message names the cause.
    """

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class CheckpointTimeoutError(CheckpointError, TimeoutError):
    """A bounded wait ran out: for parts to be acknowledged, for a lock, or for storage."""


class InputChangedError(CheckpointError, RuntimeError):
    """A file was overwritten in place while a background save was reading it."""


class CheckpointClosedError(CheckpointError, RuntimeError):
    """The checkpoint helper was closed; its workspace is gone."""


class InvalidCheckpointInputError(CheckpointError, ValueError):
    """A value given to the API cannot be checkpointed (for example empty bytes or a socket)."""


class UnsupportedTypeError(CheckpointError, TypeError):
    """A value of an unsupported type was given to the API."""


class UnsupportedURIError(CheckpointError, ValueError):
    """A storage URI this package cannot use: an unknown scheme, no bucket, or (for a checkpoint
    object) no key or a trailing ``/``."""


class BackendNotInstalledError(CheckpointError, ImportError):
    """The fsspec backend for a URI scheme is not installed; the message names the extra."""


class NoTaskCheckpointError(CheckpointError, RuntimeError):
    """A task's checkpoint was asked for outside a task, or in one given no checkpoint location."""


class PreemptionDeadlineError(CheckpointTimeoutError):
    """A save after a preemption notice was not started, or was stopped, because it could not
    commit before the expected SIGKILL; the previous checkpoint (or the one in flight) is kept."""


class Preempted(SystemExit):
    """The task stops because the machine is being taken away (a preemption notice).

    Raised by ``raise checkpoint.preemption()`` in a task that handles the notice, and in the
    main thread of one that does not, once its saves in flight have committed. A ``SystemExit``,
    so ``except Exception`` does not swallow it; uncaught, it ends the process with status
    :attr:`code`, ``128 + signum`` (143 for SIGTERM), what a shell reports for a process the
    signal ended. The runners catch it and retry on their own preemption budget, never the
    user's ``retries``.
    """

    def __init__(self, message: str, *, source: str, signal: int | None, saved: bool | None) -> None:
        super().__init__(128 + (signal or 15))
        self.message = message
        self.source = source
        """What gave notice: ``"SIGTERM"``, ``"aws-spot"``, ..."""
        self.signal = signal
        self.saved = saved
        """Whether a save committed after the notice (``None``: not known where it was raised)."""

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only arguments: pickled by hand (Ray, processes)
        return (_rebuild_preempted, (self.message, self.source, self.signal, self.saved))


def _rebuild_preempted(message: str, source: str, signal: int | None, saved: bool | None) -> Preempted:
    return Preempted(message, source=source, signal=signal, saved=saved)


class ConfigurationError(CheckpointError, ValueError):
    """Required configuration (such as ``run_base_dir``) is missing or invalid."""


def add_context(exc: BaseException, note: str, *, uri: str | None = None) -> None:
    """Add ``note`` (and the checkpoint's ``uri``) to ``exc`` without re-creating it: its class,
    attributes and traceback stay.

    The note goes through ``exc.add_note`` on Python 3.11+, which tracebacks print; on 3.10 it
    is kept in the same ``__notes__`` list, which :func:`describe_error` reads. ``uri`` is set as
    :attr:`CheckpointError.uri` (named in the message) unless the error already has one.
    """
    if uri is not None and isinstance(exc, CheckpointError) and exc.uri is None:
        exc.uri = uri
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - exercised by the 3.10 CI job
        setattr(exc, "__notes__", [*getattr(exc, "__notes__", ()), note])  # noqa: B010


def describe_error(exc: BaseException) -> str:
    """``str(exc)`` followed by its notes: the one line a command prints for an error."""
    notes = [str(note) for note in getattr(exc, "__notes__", ())]
    return "; ".join([str(exc), *notes])
