"""The ``flyte-checkpoint`` command: look at, verify, fetch and store checkpoints, and run a task.

One module per command group: :mod:`.objects` (``inspect``, ``verify``, ``get``, ``put``),
:mod:`.listing` (``ls``) and :mod:`.run` (``run``); beside them the exit statuses
(:mod:`.exit_codes`), the command line (:mod:`.parser`), the progress bar (:mod:`.progress`),
how failures are reported (:mod:`.reporting`) and the entry point (:mod:`.main`). Everything a
caller of the command's Python API used before the split is importable from here.
"""

from flyte_checkpoint.cli.exit_codes import (
    EXIT_CODES,
    EXIT_CONFIGURATION,
    EXIT_CORRUPT,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_OUTPUT_CLOSED,
    EXIT_PERMISSION,
    EXIT_PREEMPTED,
    EXIT_STORAGE,
    EXIT_TASK_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    PREEMPTED_BY_SIGNAL,
    ExitCode,
    exit_code_for,
    kind_of,
)
from flyte_checkpoint.cli.main import main
from flyte_checkpoint.cli.parser import EXAMPLES, build_parser
from flyte_checkpoint.cli.progress import progress_bar

__all__ = [
    "EXAMPLES",
    "EXIT_CODES",
    "EXIT_CONFIGURATION",
    "EXIT_CORRUPT",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_OUTPUT_CLOSED",
    "EXIT_PERMISSION",
    "EXIT_PREEMPTED",
    "EXIT_STORAGE",
    "EXIT_TASK_FAILED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "PREEMPTED_BY_SIGNAL",
    "ExitCode",
    "build_parser",
    "exit_code_for",
    "kind_of",
    "main",
    "progress_bar",
]
