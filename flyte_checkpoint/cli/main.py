"""The entry point: parse the command line, run the command, map a failure to its exit status."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from flyte_checkpoint.cli.exit_codes import exit_code_for
from flyte_checkpoint.cli.listing import ls_command
from flyte_checkpoint.cli.objects import get_command, inspect_command, put_command, verify_command
from flyte_checkpoint.cli.parser import build_parser
from flyte_checkpoint.cli.reporting import output_closed, report_error
from flyte_checkpoint.cli.run import run_command

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": inspect_command,
    "verify": verify_command,
    "get": get_command,
    "put": put_command,
    "ls": ls_command,
    "run": run_command,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flyte-checkpoint`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at exit
        return code
    except BrokenPipeError:  # storage errors arrive typed: this is stdout's reader gone
        return output_closed()
    except Exception as exc:  # one clear line (or JSON) unless --debug; the code says the kind
        code = exit_code_for(exc)
        if args.debug:
            traceback.print_exc()
        try:
            report_error(args, exc, code)
            sys.stdout.flush()
        except BrokenPipeError:  # nobody reads the report: the status still says what happened
            output_closed()
        return code
