"""How a failure reaches the user: one line on stderr or one JSON object; a closed output."""

from __future__ import annotations

import argparse
import json
import os
import sys

from flyte_checkpoint.cli.exit_codes import EXIT_OUTPUT_CLOSED, kind_of
from flyte_checkpoint.errors import Preempted, describe_error


def report_error(
    args: argparse.Namespace, error: BaseException, code: int, *, kind: str | None = None
) -> None:
    """One line on stderr, or (``--json``) one JSON object on stdout: kind, type, message, exit code.

    ``kind`` is the stable name of the exit status (:data:`EXIT_CODES`), ``type`` the class.
    """
    kind = kind or kind_of(code)
    if getattr(args, "json", False):
        document = {"error": {"kind": kind, "type": type(error).__name__, "message": describe_error(error)}}
        print(json.dumps({**document, "exit_code": code}, indent=2))
        return
    if isinstance(error, Preempted):  # its message says it all: "preempted by SIGTERM ..."
        print(f"flyte-checkpoint: {describe_error(error)}", file=sys.stderr)
        return
    said = "task failed" if kind == "task_failed" else "error"
    print(f"flyte-checkpoint: {said}: {type(error).__name__}: {describe_error(error)}", file=sys.stderr)


def output_closed() -> int:
    """The reader of stdout went away (``| head -1``): stop quietly, as a tool ``SIGPIPE`` ends.

    What is still buffered can go nowhere; stdout becomes ``/dev/null`` so that flushing it at
    exit raises no second error (the recipe of Python's ``signal`` documentation).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OUTPUT_CLOSED
