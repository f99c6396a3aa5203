"""``ls``: the steps under a multi-part checkpoint root, or the one multi-part checkpoint there."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from flyte_checkpoint.cli.exit_codes import EXIT_OK
from flyte_checkpoint.cli.parser import storage_options_of, transfer_settings_of
from flyte_checkpoint.errors import CheckpointNotFoundError, InvalidCheckpointInputError
from flyte_checkpoint.progress import human_size

if TYPE_CHECKING:
    from flyte_checkpoint.storage.options import TransferSettings


def ls_command(args: argparse.Namespace) -> int:
    from flyte_checkpoint.state import CheckpointManager

    steps = CheckpointManager(
        args.root, storage_options=storage_options_of(args), transfer=transfer_settings_of(args)
    ).describe_steps()
    if not steps:
        _check_root_exists(args)
        if is_state_root(args.root, storage_options_of(args), transfer_settings_of(args)):
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


def is_state_root(uri: str, options: dict[str, Any] | None, transfer: TransferSettings | None) -> bool:
    """Whether ``uri`` is one multi-part checkpoint (its commit pointer, or versions, are there)."""
    from flyte_checkpoint.state.layout import POINTER_NAME, VERSIONS_DIR
    from flyte_checkpoint.storage import backend_for

    root = uri.rstrip("/")
    backend = backend_for(root, options, transfer=transfer)
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
    elif backend_for(root, storage_options_of(args), transfer=transfer_settings_of(args)).list_prefix(root):
        return
    raise CheckpointNotFoundError(
        f"nothing at {args.root}: no steps and no multi-part checkpoint; check the root's spelling"
    )


def _ls_state_root(args: argparse.Namespace) -> int:
    """Describe a :class:`~flyte_checkpoint.state.StateCheckpoint` root: its committed version."""
    from flyte_checkpoint.state import StateCheckpoint

    manifest = StateCheckpoint(
        args.root, storage_options=storage_options_of(args), transfer=transfer_settings_of(args)
    ).manifest()
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
