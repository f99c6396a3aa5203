"""The command line: the argument parser, the parsing of option values, and the storage options given."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from flyte_checkpoint.cli.exit_codes import exit_status_help

if TYPE_CHECKING:
    from flyte_checkpoint.storage.options import TransferSettings


EXAMPLES = {
    "inspect": "flyte-checkpoint inspect s3://bucket/run/checkpoint --verify --json",
    "verify": "flyte-checkpoint verify gs://bucket/run/checkpoint",
    "get": "flyte-checkpoint get s3://bucket/run/checkpoint ./restored",
    "put": "flyte-checkpoint put ./model_dir s3://bucket/run/checkpoint",
    "ls": "flyte-checkpoint ls s3://bucket/run/state",
    "run": "flyte-checkpoint run --checkpoint-path s3://b/run/checkpoint --prev-checkpoint "
    "s3://b/run/prev_checkpoint train:main --inputs '{\"epochs\": 10}'",
}


def _storage_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def _inputs(text: str) -> dict[str, Any]:
    try:
        inputs: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(inputs, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object of keyword arguments, e.g. '{{\"epochs\": 10}}', not {text!r}"
        )
    return inputs


def _grace_seconds(text: str) -> float:
    from flyte_checkpoint.preemption.notice import check_grace_seconds

    try:
        return check_grace_seconds(float(text))
    except ValueError:  # not a number, or (ConfigurationError) not one of seconds > 0
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0") from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``flyte-checkpoint`` command."""
    from flyte_checkpoint import __version__

    parser = argparse.ArgumentParser(
        prog="flyte-checkpoint",
        description="Look at, verify, fetch and store task checkpoints.",
        epilog=exit_status_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flyte-checkpoint {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=summary,
            description=description,
            epilog=f"example: {EXAMPLES[name]}\n\n{exit_status_help(name)}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--json", action="store_true", help="print JSON for machines (errors too)")
        sub.add_argument(
            "--storage-option",
            "-o",
            action="append",
            type=_storage_option,
            default=[],
            metavar="KEY=VALUE",
            help="an fsspec storage option (VALUE parsed as JSON when it is JSON); repeatable",
        )
        sub.add_argument(
            "--transfer",
            "-t",
            action="append",
            type=_storage_option,
            default=[],
            metavar="KEY=VALUE",
            help="a transfer setting of this package (part_size, max_concurrency, file_concurrency, "
            "part_attempts, transfer_timeout, stale_upload_age, fsync; VALUE parsed as JSON when it "
            "is JSON); repeatable",
        )
        return sub

    inspect = command(
        "inspect",
        "describe a stored checkpoint",
        "Show a checkpoint's format, size, recorded digest, time and, for a directory archive, "
        "its members (read from the stream, nothing is extracted).",
    )
    inspect.add_argument("uri", metavar="URI")
    inspect.add_argument("--verify", action="store_true", help="read it whole and check every digest")
    inspect.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    verify = command(
        "verify",
        "check a stored checkpoint end to end",
        "Read the whole object and run every check its format has (recorded size and digest, "
        "gzip CRC, tar structure). Exit 0 when sound, 4 when absent or empty, 5 when damaged, 6-8 "
        "when the store could not be read. A multi-part checkpoint (a directory of parts) is "
        "described by ls.",
    )
    verify.add_argument("uri", metavar="URI")
    verify.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    get = command(
        "get",
        "restore a checkpoint into a directory",
        "Do what load() does, into DIR: a directory archive is extracted (safely), a raw object "
        "becomes DIR/payload. A non-empty DIR is refused unless --force.",
    )
    get.add_argument("uri", metavar="URI")
    get.add_argument("directory", metavar="DIR")  # a str: Path("") would be the current directory
    get.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    get.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    put = command(
        "put",
        "save a file or directory as a checkpoint",
        "Do what save() does: a file is stored as-is, a directory as one .tar.gz, atomically.",
    )
    put.add_argument("path", metavar="PATH")  # a str: Path("") would be the current directory
    put.add_argument("uri", metavar="URI")
    put.add_argument("--level", type=int, default=None, help="gzip level for directories, 0 (store) to 9")
    put.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    ls = command(
        "ls",
        "list the steps of a multi-part checkpoint root",
        "List step_<n> directories under ROOT with their state, size, part count and metadata.",
    )
    ls.add_argument("root", metavar="ROOT")

    run = command(
        "run",
        "run one task attempt with its checkpoint locations (a container entry point)",
        "Run MODULE:FUNCTION once inside a task context whose checkpoint saves to --checkpoint-path "
        "and restores from --prev-checkpoint. The attempt number comes from FLYTE_ATTEMPT_NUMBER. "
        "The result is printed as JSON. MODULE is imported from the current directory first, as "
        "python -m does. SIGTERM is a preemption notice the task reads as checkpoint.preempted.",
    )
    run.add_argument("--checkpoint-path", required=True, metavar="URI")
    run.add_argument("--prev-checkpoint", default=None, metavar="URI")
    run.add_argument(
        "--inputs", type=_inputs, default="{}", metavar="JSON", help="keyword arguments as a JSON object"
    )
    walk_back = "with --action-name, loads walk back past attempts that saved nothing (.../RUN/ACTION/N/...)"
    run.add_argument("--run-name", metavar="RUN", help=f"the run's name; {walk_back}")
    run.add_argument("--action-name", metavar="ACTION", help="the action's name; see --run-name")
    run.add_argument(
        "--grace-seconds",
        type=_grace_seconds,
        default=None,
        metavar="SECONDS",
        help="time from SIGTERM to the SIGKILL (default: $FLYTE_CHECKPOINT_GRACE_SECONDS, else 30)",
    )
    run.add_argument("task", metavar="MODULE:FUNCTION")
    return parser


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The storage options given with ``--storage-option`` (``None`` for none)."""
    return dict(args.storage_option) or None


def transfer_settings_of(args: argparse.Namespace) -> TransferSettings | None:
    """The ``--transfer`` settings; ``None`` when none were given (they may be storage options)."""
    from flyte_checkpoint.storage.options import TransferSettings

    given = dict(args.transfer)
    return TransferSettings(**given) if given else None
