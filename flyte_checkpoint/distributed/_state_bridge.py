"""The one place this package reaches into ``flyte_checkpoint.state``: versioned layout, commit, GC.

A distributed save is a ``flyte_checkpoint.state`` checkpoint directory like any other::

    checkpoint_dir/
      COMMITTED.json                 the pointer (written last): version id + manifest sha256
      versions/<version_id>/
        shard-00000.distcp ...       one object per saving rank (the manifest's parts)
        controller.bin               DCP's pickled Metadata (the manifest's controller record;
                                     ``.metadata`` in DCP's own layout)
                                     (the manifest's metadata carries the DCP_MARKER)
        metadata.json, manifest.json

so the state package's pointer commit, its reading of what is committed and its garbage
collection serve both. Everything this package needs from ``state`` is below, and nothing else
imports ``state``: when ``state`` offers a public "commit this version from gathered results"
step, only this module changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flyte_checkpoint.errors import CheckpointCorruptError
from flyte_checkpoint.state.checkpoint import StateCheckpoint
from flyte_checkpoint.state.layout import VERSIONS_DIR, Layout, _normalised_root, new_version_id
from flyte_checkpoint.state.manager import CheckpointManager
from flyte_checkpoint.state.manifest import PartAck, PartRecord, checked_metadata
from flyte_checkpoint.state.objects import fetch_bytes
from flyte_checkpoint.state.pointer import pointer_moved, read_committed
from flyte_checkpoint.steps import step_dir_name
from flyte_checkpoint.storage import Backend, StorageOptions
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.uris import check_supported

__all__ = [
    "DCP_MARKER",
    "METADATA_ENCODING",
    "SHARD_ENCODING",
    "Committed",
    "StoredObject",
    "apply_retention",
    "backend_of",
    "checked_metadata",
    "commit_version",
    "committed_steps",
    "fetch_verified",
    "new_version_id",
    "object_uri",
    "read_committed_version",
    "root_of",
    "step_dir",
    "version_replaced",
]

METADATA_ENCODING = "dcp-metadata-pickle-v1"
DCP_MARKER = "flyte_checkpoint.distributed"
"""Key in the manifest's metadata (value: the format version, 1) that marks a DCP checkpoint."""
SHARD_ENCODING = "dcp-shard-v1"


@dataclass(frozen=True)
class StoredObject:
    """One object a save wrote: its name in the version directory, size and labelled digest."""

    name: str
    size: int
    digest: str


@dataclass(frozen=True)
class Committed:
    """What the pointer of a checkpoint directory names."""

    version_id: str
    metadata_object: StoredObject
    shards: Mapping[str, StoredObject]
    user_metadata: dict[str, Any]


def _layout(
    root: str, storage_options: StorageOptions | None, transfer: TransferSettings | None = None
) -> Layout:
    return Layout.of(root, storage_options, transfer)


def root_of(checkpoint_dir: str | os.PathLike[str]) -> str:
    """``checkpoint_dir`` normalised and checked as state normalises it (a clear error if unusable).

    No backend is built: that needs the storage options (Azure's client connects when built).
    """
    root = _normalised_root(checkpoint_dir)
    check_supported(root)
    return root


def backend_of(
    root: str, storage_options: StorageOptions | None, transfer: TransferSettings | None = None
) -> Backend:
    return _layout(root, storage_options, transfer).backend


def object_uri(root: str, version_id: str, name: str) -> str:
    """The URI of object ``name`` in version ``version_id`` of ``root`` (no backend built)."""
    return "/".join((root, VERSIONS_DIR, version_id, name))


def commit_version(
    root: str,
    storage_options: StorageOptions | None,
    version_id: str,
    shards: Sequence[StoredObject],
    dcp_metadata: bytes,
    user_metadata: dict[str, Any],
    transfer: TransferSettings | None = None,
) -> None:
    """Commit ``version_id``, whose shards every rank has stored, with state's public commit step.

    The shards become the manifest's parts (by position, in the given order, each checked
    against its stored object's size and digest) and DCP's metadata its controller record, so
    the committed manifest pins every object; the pointer is written last (the commit point),
    then older versions are collected. The marker in the manifest's metadata tells a DCP
    checkpoint from other state checkpoints.
    """
    acks = [
        PartAck(
            name=shard.name,
            part_id=os.urandom(8).hex(),
            size=shard.size,
            digest=shard.digest,
            encoding=SHARD_ENCODING,
            position=position,
        )
        for position, shard in enumerate(shards)
    ]
    StateCheckpoint(root, storage_options=storage_options, transfer=transfer).commit_version(
        version_id, acks, controller=dcp_metadata, metadata={**user_metadata, DCP_MARKER: 1}
    )


def read_committed_version(
    root: str, storage_options: StorageOptions | None, transfer: TransferSettings | None = None
) -> Committed:
    """The committed version of ``root``; ``CheckpointNotFoundError`` / ``CheckpointCorruptError``."""
    manifest = read_committed(_layout(root, storage_options, transfer))
    record = manifest.controller
    if record is None or manifest.metadata.get(DCP_MARKER) != 1:
        raise CheckpointCorruptError(
            f"{root} is a flyte_checkpoint.state checkpoint, but not a distributed (DCP) one: its "
            "manifest records no DCP metadata; load it with flyte_checkpoint.state instead"
        )
    user_metadata = {key: value for key, value in manifest.metadata.items() if key != DCP_MARKER}
    return Committed(
        version_id=manifest.version_id,
        metadata_object=StoredObject(record.name, record.size, record.digest),
        shards={part.name: StoredObject(part.name, part.size, part.digest) for part in manifest.parts},
        user_metadata=user_metadata,
    )


def fetch_verified(
    root: str,
    storage_options: StorageOptions | None,
    version_id: str,
    stored: StoredObject,
    label: str,
    transfer: TransferSettings | None = None,
) -> bytes:
    """The bytes of one small object, checked against its recorded size and digest (with retries)."""
    record = PartRecord(
        name=stored.name, part_id="-", size=stored.size, digest=stored.digest, encoding=METADATA_ENCODING
    )
    layout = _layout(root, storage_options, transfer)
    return fetch_bytes(layout.backend, object_uri(root, version_id, stored.name), record, label)


def version_replaced(
    root: str,
    storage_options: StorageOptions | None,
    version_id: str,
    transfer: TransferSettings | None = None,
) -> bool:
    """Whether a newer commit replaced ``version_id`` (a failed read of it is then a race, not damage)."""
    return pointer_moved(_layout(root, storage_options, transfer), version_id)


# --------------------------------------------------------------------------- steps and retention


def _steps(
    root: str,
    storage_options: StorageOptions | None,
    keep_last: int | None,
    transfer: TransferSettings | None = None,
) -> CheckpointManager:
    return CheckpointManager(root, keep_last=keep_last, storage_options=storage_options, transfer=transfer)


def step_dir(root: str, step: int) -> str:
    """The checkpoint directory of ``step`` under ``root`` (``root/step_<n>``)."""
    return f"{root}/{step_dir_name(step)}"


def committed_steps(
    root: str, storage_options: StorageOptions | None, transfer: TransferSettings | None = None
) -> list[int]:
    """The committed steps under ``root``, oldest first."""
    return _steps(root, storage_options, None, transfer).steps()


def apply_retention(
    root: str,
    storage_options: StorageOptions | None,
    keep_last: int,
    protect: set[int],
    transfer: TransferSettings | None = None,
) -> list[int]:
    """Keep the newest ``keep_last`` committed steps and ``protect``; returns the deleted steps."""
    return _steps(root, storage_options, keep_last, transfer).apply_retention(protect=protect)
