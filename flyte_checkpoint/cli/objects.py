"""The commands on one checkpoint object: ``inspect``, ``verify``, ``get`` and ``put``."""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flyte_checkpoint.cli.exit_codes import EXIT_OK
from flyte_checkpoint.cli.listing import is_state_root
from flyte_checkpoint.cli.parser import storage_options_of, transfer_settings_of
from flyte_checkpoint.cli.progress import progress_bar
from flyte_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointStorageError,
    InvalidCheckpointInputError,
    UnsupportedURIError,
)
from flyte_checkpoint.progress import human_size

if TYPE_CHECKING:
    from flyte_checkpoint.single.inspection import ObjectReport
    from flyte_checkpoint.storage.options import TransferSettings


def inspect_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.single.inspection import inspect_object

    with _one_object(args), progress_bar("reading", args.quiet or args.json) as progress:
        report = inspect_object(
            args.uri,
            storage_options=storage_options_of(args),
            transfer=transfer_settings_of(args),
            verify=args.verify,
            progress=progress,
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
        found = _multi_part_at(args.uri, storage_options_of(args), transfer_settings_of(args))
        if found is None:
            raise
        raise InvalidCheckpointInputError(
            f"{args.uri} is {found}, not one checkpoint object, which `{args.command}` reads; "
            f"list its steps and versions with: flyte-checkpoint ls {args.uri.rstrip('/')}"
        ) from exc


def _multi_part_at(uri: str, options: dict[str, Any] | None, transfer: TransferSettings | None) -> str | None:
    """What multi-part checkpoint is at ``uri``, in words; ``None`` if none (or it cannot tell)."""
    from flyte_checkpoint.state import CheckpointManager

    try:
        if is_state_root(uri, options, transfer):
            return "a multi-part checkpoint (a StateCheckpoint, or one step of a CheckpointManager)"
        if CheckpointManager(uri, storage_options=options, transfer=transfer).steps():
            return "the root of a CheckpointManager's steps"
    except Exception as exc:  # cannot tell: the error of the read stands
        logging.getLogger("flyte_checkpoint").debug("could not tell what is at %s: %r", uri, exc)
    return None


def _describe_kind(kind: str) -> str:
    return {
        "archive": "directory archive (.tar.gz)",
        "payload": "raw payload (restored as payload)",
        "manifest": "incremental checkpoint manifest (its files are chunks stored beside it)",
        "empty": "empty object (means no checkpoint)",
    }[kind]


def verify_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.single.inspection import inspect_object

    with _one_object(args), progress_bar("verifying", args.quiet or args.json) as progress:
        report = inspect_object(
            args.uri,
            storage_options=storage_options_of(args),
            transfer=transfer_settings_of(args),
            verify=True,
            progress=progress,
        )
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


def get_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.single.inspection import restore_to

    if not args.directory.strip():
        raise InvalidCheckpointInputError(
            "DIR is empty; name the directory to restore into ('.' for this one)"
        )
    with _one_object(args), progress_bar("restoring", args.quiet or args.json) as progress:
        restored = restore_to(
            args.uri,
            Path(args.directory),
            storage_options=storage_options_of(args),
            transfer=transfer_settings_of(args),
            force=args.force,
            progress=progress,
        )
    if args.json:
        print(json.dumps({"uri": args.uri, "restored": str(restored)}, indent=2))
        return EXIT_OK
    print(f"restored {args.uri} to {restored}")
    return EXIT_OK


def put_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.single.checkpoint import Checkpoint

    options: dict[str, Any] = {
        "storage_options": storage_options_of(args),
        "transfer": transfer_settings_of(args),
    }
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
