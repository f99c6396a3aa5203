"""Translation of backend and OS errors into this package's typed errors, at one boundary."""

from __future__ import annotations

import errno
import tempfile
from types import TracebackType

from flyte_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    CheckpointStorageError,
    CheckpointUnavailableError,
)

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EPIPE,
        errno.EAGAIN,
    }
)


_READING_ACTIONS = frozenset({"reading", "loading", "inspecting", "listing"})
"""Actions that only read: a refusal there is about read permission, not a place to write."""


def os_error_to_checkpoint_error(exc: OSError, uri: str, action: str) -> CheckpointError:
    """The typed error for an ``OSError`` raised while ``action`` (e.g. "saving") ``uri``."""
    if isinstance(exc, CheckpointError):
        return exc
    if exc.errno == errno.EROFS:  # no permission or credential can fix a read-only mount
        return CheckpointStorageError(
            f"read-only filesystem {action} {uri}: {exc.strerror or exc}; the location is on a "
            "file system mounted read-only: choose a location on a writable one"
        )
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        if action in _READING_ACTIONS:
            advice = "check that the process may read it (file and directory permissions)"
        else:
            advice = (
                "check that the process may write there (file and directory permissions) "
                "or choose another location"
            )
        return CheckpointPermissionError(f"permission denied {action} {uri}: {exc.strerror or exc}; {advice}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        if action.startswith("restoring"):
            temp = tempfile.gettempdir()
            return CheckpointStorageError(
                f"out of space {action} {uri}: {exc.strerror or exc}; nothing was restored and the "
                f"stored checkpoint is unchanged. The restore workspace is in TMPDIR ({temp}): free "
                "space there, or set TMPDIR to a directory on a larger disk, then load again"
            )
        return CheckpointStorageError(
            f"out of space {action} {uri}: {exc.strerror or exc}; the previous checkpoint is "
            "untouched; free space or raise the quota, then save again"
        )
    if isinstance(exc, TimeoutError | ConnectionError) or exc.errno in _TRANSIENT_ERRNOS:
        return CheckpointUnavailableError(f"storage unavailable {action} {uri}: {exc}")
    if isinstance(exc, FileNotFoundError) and action.startswith("restoring"):
        # Writing the restored files: what is missing is a directory to write into (or one the
        # file system will not create, as in /proc), never the checkpoint, which was read.
        return CheckpointStorageError(
            f"cannot write {uri} ({action}): {exc.strerror or exc}; a directory on its path does "
            "not exist or cannot hold new entries: restore into a writable directory"
        )
    if isinstance(exc, FileNotFoundError):
        return CheckpointNotFoundError(f"not found {action} {uri}: {exc}")
    if isinstance(exc, NotADirectoryError) or exc.errno == errno.ENOTDIR:
        return CheckpointStorageError(
            f"cannot use {uri} ({action}): a parent of it is a file, not a directory"
        )
    if isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
        return CheckpointStorageError(
            f"cannot use {uri} ({action}): it is a directory; a checkpoint location names a "
            "single object, e.g. .../checkpoint"
        )
    return CheckpointStorageError(f"storage error {action} {uri}: {exc}")


class translated_os_errors:  # lower case, like contextlib.suppress: it replaced a function
    """Re-raise any ``OSError`` inside the block as the matching :class:`CheckpointError`.

    A class, not ``@contextmanager``: it wraps every write of a save, and a generator-based
    context manager cost a few microseconds each time, a noticeable share of a 1 KiB save.
    """

    __slots__ = ("_action", "_uri")

    def __init__(self, uri: str, action: str) -> None:
        self._uri = uri
        self._action = action

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, CheckpointError):
            raise os_error_to_checkpoint_error(exc, self._uri, self._action) from exc
