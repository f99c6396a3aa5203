"""The command's exit statuses: one code per kind of outcome, the same for every subcommand."""

from __future__ import annotations

import signal
from typing import NamedTuple

from flyte_checkpoint.errors import (
    BackendNotInstalledError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    CheckpointStorageError,
    CheckpointTimeoutError,
    CheckpointUnavailableError,
    ConfigurationError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
    UnsupportedURIError,
)

EXIT_OK = 0
"""Done: the object is sound (``verify``), restored, saved, listed, or the task returned."""


EXIT_TASK_FAILED = 1
"""``run``: the task raised (its error is printed); any other command: an unexpected error."""


EXIT_USAGE = 2
"""The command line is wrong (argparse's own status): an unknown option, a malformed value."""


EXIT_CONFIGURATION = 3
"""A configuration mistake: an empty or unsupported URI, an invalid bucket name, a bad storage
option, a missing extra, an unusable input, a multi-part checkpoint given where one object is
read, a task reference that does not import."""


EXIT_NOT_FOUND = 4
"""No checkpoint there (no object, or an empty one; for ``ls``, nothing at the root), or the path
to save does not exist. Never a failure to write: a script may read 4 as "start over"."""


EXIT_CORRUPT = 5
"""The checkpoint is damaged or unsafe (digest, gzip CRC, truncation, a hostile archive)."""


EXIT_UNAVAILABLE = 6
"""The store could not be reached, or did not answer in time, after bounded retries."""


EXIT_PERMISSION = 7
"""The store or the file system refused access (credentials, permissions)."""


EXIT_STORAGE = 8
"""Any other storage failure (out of space, a read-only file system, a location that is not a
file, a directory that cannot be written)."""


EXIT_PREEMPTED = 75
"""``run``: the attempt was preempted and a checkpoint saved after the notice committed, so a retry
resumes from it (``EX_TEMPFAIL`` of sysexits.h: try again later). Preempted with no save committed
after the notice, ``run`` exits ``128 + signum`` (143 for SIGTERM), as if the signal had ended it."""


EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE
"""The reader of the output went away first (``... | head -1``): the command stops quietly with
the status of a tool ``SIGPIPE`` ended, as ``cat`` would (141)."""


PREEMPTED_BY_SIGNAL = "128+N"
"""``run``: preempted by signal ``N`` with no save committed after the notice (a status, not one code)."""


EXIT_INTERRUPTED = 128 + signal.SIGINT
"""``run``: interrupted by Ctrl-C (SIGINT); what the next run resumes from is printed."""


class ExitCode(NamedTuple):
    """One exit status of the command: its number, the ``kind`` its ``--json`` error names, what
    it means, and the subcommands that can return it."""

    code: int | str
    kind: str
    meaning: str
    commands: tuple[str, ...]


_ALL = ("inspect", "verify", "get", "put", "ls", "run")


_READING = ("inspect", "verify", "get", "ls")


_STORE = ("inspect", "verify", "get", "put", "ls")


_RUN = ("run",)


EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(EXIT_OK, "ok", "done", _ALL),
    ExitCode(EXIT_TASK_FAILED, "unexpected", "an unexpected error (a bug: please report it)", _ALL),
    ExitCode(EXIT_TASK_FAILED, "task_failed", "run: the task raised", _RUN),
    ExitCode(EXIT_USAGE, "usage", "bad command line", _ALL),
    ExitCode(
        EXIT_CONFIGURATION,
        "configuration",
        "configuration mistake (URI, bucket name, scheme, storage option, extra, input, task reference)",
        _ALL,
    ),
    ExitCode(EXIT_NOT_FOUND, "not_found", "no checkpoint there (absent or empty), PATH missing", _STORE),
    ExitCode(EXIT_CORRUPT, "corrupt", "damaged or unsafe checkpoint", _READING),
    ExitCode(EXIT_UNAVAILABLE, "unavailable", "store unreachable or timed out", _STORE),
    ExitCode(EXIT_PERMISSION, "permission", "access refused", _STORE),
    ExitCode(EXIT_STORAGE, "storage", "other storage failure (out of space, read-only, not a file)", _STORE),
    ExitCode(
        EXIT_PREEMPTED,
        "preempted",
        "run: preempted after a checkpoint saved after the notice committed",
        _RUN,
    ),
    ExitCode(
        PREEMPTED_BY_SIGNAL, "preempted", "run: preempted by signal N, no save committed after it", _RUN
    ),
    ExitCode(
        EXIT_INTERRUPTED,
        "interrupted",
        "run: interrupted by Ctrl-C (says whether the checkpoint committed)",
        _RUN,
    ),
    ExitCode(
        EXIT_OUTPUT_CLOSED, "output_closed", "the output's reader left early (head -1): stopped quietly", _ALL
    ),
)
"""Every exit status, with the kind a ``--json`` error names: one code per kind of outcome, the
same for every command (docs/guides/command.md holds the same table)."""


def exit_code_for(error: BaseException) -> int:
    """The exit status for ``error``, by its kind (see :data:`EXIT_CODES`)."""
    kinds: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
        (CheckpointNotFoundError, EXIT_NOT_FOUND),
        (CheckpointCorruptError, EXIT_CORRUPT),
        ((CheckpointUnavailableError, CheckpointTimeoutError), EXIT_UNAVAILABLE),
        (CheckpointPermissionError, EXIT_PERMISSION),
        (
            (ConfigurationError, UnsupportedURIError, BackendNotInstalledError, InvalidCheckpointInputError,
             UnsupportedTypeError),
            EXIT_CONFIGURATION,
        ),
        (CheckpointStorageError, EXIT_STORAGE),
    )  # fmt: skip
    for kind, code in kinds:
        if isinstance(error, kind):
            return code
    return EXIT_TASK_FAILED


def kind_of(code: int) -> str:
    """The ``kind`` a ``--json`` error names for exit status ``code`` (``run`` names its task's
    failure ``task_failed`` and a preemption ``preempted`` itself)."""
    return next(entry.kind for entry in EXIT_CODES if entry.code == code)


def exit_status_help(command: str | None = None) -> str:
    """The exit statuses ``command`` can return (every one for the command as a whole)."""
    lines = [
        f"  {entry.code:>5}  {entry.meaning}"
        for entry in EXIT_CODES
        if command is None or command in entry.commands
    ]
    return "exit status:\n" + "\n".join(lines)
