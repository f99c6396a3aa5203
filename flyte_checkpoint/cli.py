"""The ``flyte-checkpoint`` command: look at, verify, fetch and store checkpoints, and run a task."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from flyte_checkpoint.errors import (
    BackendNotInstalledError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    CheckpointStorageError,
    CheckpointTimeoutError,
    CheckpointUnavailableError,
    ConfigurationError,
    InvalidCheckpointInputError,
    Preempted,
    UnsupportedTypeError,
    UnsupportedURIError,
    describe_error,
)
from flyte_checkpoint.progress import human_size

if TYPE_CHECKING:
    from flyte_checkpoint.inspection import ObjectReport

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


def _exit_status_help(command: str | None = None) -> str:
    """The exit statuses ``command`` can return (every one for the command as a whole)."""
    lines = [
        f"  {entry.code:>5}  {entry.meaning}"
        for entry in EXIT_CODES
        if command is None or command in entry.commands
    ]
    return "exit status:\n" + "\n".join(lines)


_BAR_THRESHOLD = 4 << 20
"""Transfers smaller than this finish before a bar is worth drawing."""

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
        epilog=_exit_status_help(),
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
            epilog=f"example: {EXAMPLES[name]}\n\n{_exit_status_help(name)}",
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


@contextmanager
def progress_bar(
    description: str, quiet: bool, *, estimate: int | None = None
) -> Iterator[Callable[[int, int | None], None] | None]:
    """A progress callback drawing a bar on a terminal, for transfers over a few MiB.

    Sizes and speeds are in binary units (KiB, MiB, GiB). ``estimate`` stands in for a total
    the transfer does not know (a directory's archive): the bar then says it is an estimate and
    fills up at the end, however far the estimate was off.
    """
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def update(done: int, total: int | None) -> None:
        if total is None and estimate is not None:
            total = max(estimate, done)
            if bars and bars[0].total != total:
                bars[0].total = total
        if not bars:
            if max(done, total or 0) < _BAR_THRESHOLD:
                return
            # A terminal that reports no size (a bare pty) would get a zero-size, hidden bar.
            size = shutil.get_terminal_size((100, 24))
            bars.append(
                tqdm(
                    ncols=size.columns or 100,
                    nrows=size.lines or 24,
                    total=total,
                    desc=description,
                    # tqdm scales with "k", "M", "G"; "iB" makes its labels say MiB, as the
                    # divisor means (plain "B" showed MB for MiB).
                    unit="iB",
                    unit_scale=True,
                    unit_divisor=1024,
                    file=sys.stderr,
                )
            )
        bar = bars[0]
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            if estimate is not None:  # the estimate was only that: end at what was written
                bar.total = bar.n
                bar.refresh()
            bar.close()


def _options(args: argparse.Namespace) -> dict[str, Any] | None:
    return dict(args.storage_option) or None


def _inspect(args: argparse.Namespace) -> int:
    from flyte_checkpoint.inspection import inspect_object

    with _one_object(args), progress_bar("reading", args.quiet or args.json) as progress:
        report = inspect_object(
            args.uri, storage_options=_options(args), verify=args.verify, progress=progress
        )
    if args.json:
        print(report.model_dump_json(indent=2))
        return EXIT_OK
    print(f"uri:       {report.uri}")
    print(f"format:    {_describe_kind(report.kind)}")
    print(f"size:      {report.size} bytes ({human_size(report.size)})")
    print(f"modified:  {report.modified.isoformat() if report.modified else 'unknown'}")
    print(f"digest:    {report.recorded_digest or 'not recorded'}")
    if report.verified is not None or args.verify:
        print(f"verified:  {_verdict(report)}")
    if report.members is not None:
        print(f"members:   {len(report.members)}")
        for member in report.members:
            link = f" -> {member.link}" if member.link else ""
            print(f"  {member.kind:<9} {member.size:>12}  {member.name}{link}")
    return EXIT_OK


@contextmanager
def _one_object(args: argparse.Namespace) -> Iterator[None]:
    """Reading ``args.uri`` as one checkpoint object: when that fails and a multi-part checkpoint
    is there, say so and point to ``ls`` (a configuration mistake), not "no checkpoint" (which a
    script reads as "start over") or "a directory"."""
    try:
        yield
    except (CheckpointNotFoundError, CheckpointStorageError, UnsupportedURIError) as exc:
        found = _multi_part_at(args.uri, _options(args))
        if found is None:
            raise
        raise InvalidCheckpointInputError(
            f"{args.uri} is {found}, not one checkpoint object, which `{args.command}` reads; "
            f"list its steps and versions with: flyte-checkpoint ls {args.uri.rstrip('/')}"
        ) from exc


def _multi_part_at(uri: str, options: dict[str, Any] | None) -> str | None:
    """What multi-part checkpoint is at ``uri``, in words; ``None`` if none (or it cannot tell)."""
    from flyte_checkpoint.state import CheckpointManager

    try:
        if _is_state_root(uri, options):
            return "a multi-part checkpoint (a StateCheckpoint, or one step of a CheckpointManager)"
        if CheckpointManager(uri, storage_options=options).steps():
            return "the root of a CheckpointManager's steps"
    except Exception as exc:  # cannot tell: the error of the read stands
        logging.getLogger("flyte_checkpoint").debug("could not tell what is at %s: %r", uri, exc)
    return None


def _describe_kind(kind: str) -> str:
    return {
        "archive": "directory archive (.tar.gz)",
        "payload": "raw payload (restored as payload)",
        "empty": "empty object (means no checkpoint)",
    }[kind]


def _verify(args: argparse.Namespace) -> int:
    from flyte_checkpoint.inspection import inspect_object

    with _one_object(args), progress_bar("verifying", args.quiet or args.json) as progress:
        report = inspect_object(args.uri, storage_options=_options(args), verify=True, progress=progress)
    if report.kind == "empty":
        raise CheckpointNotFoundError(f"{args.uri} is empty, which means no checkpoint")
    if args.json:
        print(report.model_dump_json(indent=2))
        return EXIT_OK
    checked = ", ".join(report.checked or []) or "readable only"
    print(f"ok: {args.uri} ({report.size} bytes; checked: {checked})")
    for missing in report.not_checked or []:
        print(f"not checked: {missing}")
    return EXIT_OK


def _verdict(report: ObjectReport) -> str:
    if not report.verified:
        return "no: the object was not read whole"
    checked = ", ".join(report.checked or []) or "that it reads"
    if report.not_checked:
        return f"partly: checked {checked}; NOT checked: {'; '.join(report.not_checked)}"
    return f"yes, every check passed ({checked})"


def _get(args: argparse.Namespace) -> int:
    from flyte_checkpoint.inspection import restore_to

    if not args.directory.strip():
        raise InvalidCheckpointInputError(
            "DIR is empty; name the directory to restore into ('.' for this one)"
        )
    with _one_object(args), progress_bar("restoring", args.quiet or args.json) as progress:
        restored = restore_to(
            args.uri,
            Path(args.directory),
            storage_options=_options(args),
            force=args.force,
            progress=progress,
        )
    if args.json:
        print(json.dumps({"uri": args.uri, "restored": str(restored)}, indent=2))
        return EXIT_OK
    print(f"restored {args.uri} to {restored}")
    return EXIT_OK


def _put(args: argparse.Namespace) -> int:
    from flyte_checkpoint.checkpoint import Checkpoint

    options: dict[str, Any] = {"storage_options": _options(args)}
    if args.level is not None:
        options["compression_level"] = args.level
    estimate = _tree_size(Path(args.path)) if os.path.isdir(args.path) else None
    description = "saving" if estimate is None else f"saving (estimate: {human_size(estimate)} uncompressed)"
    with (
        Checkpoint(args.uri, **options) as checkpoint,
        progress_bar(description, args.quiet or args.json, estimate=estimate) as progress,
    ):
        checkpoint.save_sync(args.path, progress=progress)
    if args.json:
        print(json.dumps({"path": args.path, "uri": args.uri}, indent=2))
        return EXIT_OK
    print(f"saved {args.path} to {args.uri}")
    return EXIT_OK


def _tree_size(root: Path) -> int | None:
    """The bytes of the regular files under ``root`` (what its archive records), for the bar's
    estimate; ``None`` when the tree cannot be walked (the save itself then says why)."""
    from flyte_checkpoint.archive import content_size

    try:
        return content_size(root)
    except (OSError, CheckpointError):
        return None


def _ls(args: argparse.Namespace) -> int:
    from flyte_checkpoint.state import CheckpointManager

    steps = CheckpointManager(args.root, storage_options=_options(args)).describe_steps()
    if not steps:
        _check_root_exists(args)
        if _is_state_root(args.root, _options(args)):
            return _ls_state_root(args)
    if args.json:
        print(json.dumps([step.model_dump(mode="json") for step in steps], indent=2))
        return EXIT_OK
    if not steps:
        print(f"no steps under {args.root}")
    for step in steps:
        if not step.committed:
            print(f"step {step.step:>10}  uncommitted (an interrupted save; removed by the next commit)")
            continue
        size = human_size(step.size or 0)
        print(f"step {step.step:>10}  committed  {size:>10}  {step.parts} parts  {json.dumps(step.metadata)}")
    return EXIT_OK


def _is_state_root(uri: str, options: dict[str, Any] | None) -> bool:
    """Whether ``uri`` is one multi-part checkpoint (its commit pointer, or versions, are there)."""
    from flyte_checkpoint.state.layout import POINTER_NAME, VERSIONS_DIR
    from flyte_checkpoint.storage import backend_for

    root = uri.rstrip("/")
    backend = backend_for(root, options)
    return backend.info(f"{root}/{POINTER_NAME}") is not None or bool(
        backend.list_prefix(f"{root}/{VERSIONS_DIR}")
    )


def _check_root_exists(args: argparse.Namespace) -> None:
    """Raise unless something is at ``ROOT``: a root that is not there has no steps to list, which
    is "no checkpoint there" (a misspelt root must not read as an empty one)."""
    from flyte_checkpoint.storage import backend_for
    from flyte_checkpoint.uris import is_local, local_path

    root = args.root.rstrip("/")
    if is_local(root):
        path = local_path(root)
        if path.is_dir():
            return
        if path.exists():
            raise InvalidCheckpointInputError(
                f"{args.root} is a file, not a root of steps; `flyte-checkpoint inspect {args.root}` "
                "describes one checkpoint object"
            )
    elif backend_for(root, _options(args)).list_prefix(root):
        return
    raise CheckpointNotFoundError(
        f"nothing at {args.root}: no steps and no multi-part checkpoint; check the root's spelling"
    )


def _ls_state_root(args: argparse.Namespace) -> int:
    """Describe a :class:`~flyte_checkpoint.state.StateCheckpoint` root: its committed version."""
    from flyte_checkpoint.state import StateCheckpoint

    manifest = StateCheckpoint(args.root, storage_options=_options(args)).manifest()
    records = [*manifest.parts, *([manifest.controller] if manifest.controller else [])]
    size = sum(record.size for record in records)
    summary = {
        "kind": "state",
        "root": args.root,
        "version_id": manifest.version_id,
        "created": manifest.created.isoformat(),
        "parts": manifest.world_size,
        "controller": manifest.controller is not None,
        "size": size,
        "metadata": manifest.metadata,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    controller = " + controller" if manifest.controller is not None else ""
    print(f"{args.root} is one multi-part checkpoint (StateCheckpoint), not a root of steps")
    print(
        f"committed  version {manifest.version_id}  {human_size(size)}  "
        f"{manifest.world_size} parts{controller}  {json.dumps(manifest.metadata)}"
    )
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from flyte_checkpoint.context import CheckpointPaths
    from flyte_checkpoint.runners.attempt import load_and_run_task, resolve_task
    from flyte_checkpoint.uris import check_object_uri, clean_uri

    if clean_uri(args.checkpoint_path) is None:
        raise UnsupportedURIError(
            "--checkpoint-path is empty; give the path or URI this attempt saves its checkpoint to "
            "(an empty --prev-checkpoint means no previous attempt)"
        )
    paths = CheckpointPaths(checkpoint_path=args.checkpoint_path, prev_checkpoint_path=args.prev_checkpoint)
    for location in (args.checkpoint_path, args.prev_checkpoint):
        cleaned = clean_uri(location)
        if cleaned is not None:
            check_object_uri(cleaned)  # before the task starts, not when it first saves
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: a task module in the current directory
    task = resolve_task(args.task)  # a reference that does not import is a configuration mistake
    try:
        result = load_and_run_task(
            task,
            checkpoint_paths=paths,
            inputs=args.inputs,
            run_name=args.run_name,
            action_name=args.action_name,
            storage_options=_options(args),
            grace_seconds=args.grace_seconds,
        )
    except Preempted as preempted:
        _ignore_further_notices(preempted)
        if args.debug:
            traceback.print_exc()
        code = _preempted_exit_code(preempted)
        _report_error(args, preempted, code, kind="preempted")
        return code
    except Exception as failure:  # the task's own error: reported as the task's, exit 1
        if args.debug:
            traceback.print_exc()
        _report_error(args, failure, EXIT_TASK_FAILED, kind="task_failed")
        return EXIT_TASK_FAILED
    except KeyboardInterrupt as interrupt:  # Ctrl-C: say whether (and when) the checkpoint committed
        if args.debug:
            traceback.print_exc()
        notes = [note.removeprefix("flyte_checkpoint: ") for note in getattr(interrupt, "__notes__", [])]
        print(f"flyte-checkpoint: {'; '.join(notes) or 'interrupted'} (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(json.dumps(result, default=str))
    return EXIT_OK


def _ignore_further_notices(preempted: Preempted) -> None:
    """The attempt's outcome is decided: a later SIGTERM (the kubelet's after a cloud notice, a
    wrapper forwarding one again) must not kill the exiting process with 143 in place of 75.

    The handler was uninstalled when the attempt ended, so the signal's default action is back;
    the SIGKILL at the deadline still ends an exit that takes too long.
    """
    for signum in {signal.SIGTERM, preempted.signal}:
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)


def _preempted_exit_code(preempted: Preempted) -> int:
    if preempted.saved:
        return EXIT_PREEMPTED
    return preempted.code if isinstance(preempted.code, int) else EXIT_TASK_FAILED


def _report_error(
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


def _output_closed() -> int:
    """The reader of stdout went away (``| head -1``): stop quietly, as a tool ``SIGPIPE`` ends.

    What is still buffered can go nowhere; stdout becomes ``/dev/null`` so that flushing it at
    exit raises no second error (the recipe of Python's ``signal`` documentation).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_OUTPUT_CLOSED


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": _inspect,
    "verify": _verify,
    "get": _get,
    "put": _put,
    "ls": _ls,
    "run": _run,
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
        return _output_closed()
    except Exception as exc:  # one clear line (or JSON) unless --debug; the code says the kind
        code = exit_code_for(exc)
        if args.debug:
            traceback.print_exc()
        try:
            _report_error(args, exc, code)
            sys.stdout.flush()
        except BrokenPipeError:  # nobody reads the report: the status still says what happened
            _output_closed()
        return code
