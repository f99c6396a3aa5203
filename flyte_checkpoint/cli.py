"""The ``flyte-checkpoint`` command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from flyte_checkpoint.context import CheckpointPaths
from flyte_checkpoint.runners.runtime import load_and_run_task

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flyte-checkpoint",
        description="Checkpoints for long-running, retried tasks.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run one task attempt with its checkpoint locations (a container entry point)",
        description=(
            "Run MODULE:FUNCTION once inside a task context whose checkpoint saves to "
            "--checkpoint-path and restores from --prev-checkpoint. The attempt number comes "
            "from FLYTE_ATTEMPT_NUMBER. The result is printed as JSON."
        ),
        epilog=(
            "example: flyte-checkpoint run --checkpoint-path s3://b/run/checkpoint "
            "--prev-checkpoint s3://b/run/prev_checkpoint train:main --inputs '{\"epochs\": 10}'"
        ),
    )
    run.add_argument("--checkpoint-path", required=True, metavar="URI")
    run.add_argument("--prev-checkpoint", default=None, metavar="URI")
    run.add_argument("--inputs", default="{}", metavar="JSON", help="keyword arguments as a JSON object")
    run.add_argument("--run-name", default=None)
    run.add_argument("--action-name", default=None)
    run.add_argument("task", metavar="MODULE:FUNCTION")
    return parser


def _run(args: argparse.Namespace) -> int:
    try:
        inputs: Any = json.loads(args.inputs)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"flyte-checkpoint: error: --inputs is not valid JSON: {exc}") from None
    if not isinstance(inputs, dict):
        raise SystemExit("flyte-checkpoint: error: --inputs must be a JSON object of keyword arguments")
    paths = CheckpointPaths(checkpoint_path=args.checkpoint_path, prev_checkpoint_path=args.prev_checkpoint)
    result = load_and_run_task(
        args.task,
        checkpoint_paths=paths,
        inputs=inputs,
        run_name=args.run_name,
        action_name=args.action_name,
    )
    print(json.dumps(result, default=str))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flyte-checkpoint`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return _run(args)
    except Exception as exc:  # one clear line unless --debug
        if args.debug:
            traceback.print_exc()
        else:
            print(f"flyte-checkpoint: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_TASK_FAILED
