"""Looking at a stored checkpoint without a task: describe it, verify it, or restore it anywhere."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint import archive
from flyte_checkpoint.archive import ExtractionLimits, MemberInfo
from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.progress import ProgressCallback, ProgressReporter
from flyte_checkpoint.restore import classify, restore_object
from flyte_checkpoint.storage import StorageOptions, backend_for
from flyte_checkpoint.storage.base import VerifyingReader
from flyte_checkpoint.storage.errors import translated_os_errors

_CHUNK = 1 << 20


class ObjectReport(BaseModel):
    """What ``flyte-checkpoint inspect`` says about one stored object."""

    model_config = ConfigDict(frozen=True)

    uri: str
    kind: Literal["archive", "payload", "empty"]
    size: int
    modified: datetime | None = None
    recorded_format: str | None = None
    recorded_digest: str | None = None
    """The labelled digest recorded with the object (``"crc32:..."``), if any."""
    verified: bool | None = None
    """``True`` when the whole object was read and every check it has passed; ``None`` if not read."""
    members: list[MemberInfo] | None = None


def _open(
    uri: str, storage_options: StorageOptions | None, progress: ProgressCallback | None
) -> VerifyingReader:
    reader = backend_for(uri, storage_options).open_read(uri)
    if reader is None:
        raise CheckpointNotFoundError(f"no checkpoint at {uri}")
    if progress is not None:
        reader.progress = ProgressReporter(progress, reader.info.size)
    return reader


def inspect_object(
    uri: str,
    *,
    storage_options: StorageOptions | None = None,
    verify: bool = False,
    progress: ProgressCallback | None = None,
) -> ObjectReport:
    """Describe the object at ``uri``; archives are listed from the stream, never extracted.

    Listing an archive reads it whole, which also runs its checks. With ``verify`` a payload is
    read whole too. Raises :class:`CheckpointNotFoundError` when there is no object and
    :class:`CheckpointCorruptError` when a check fails.
    """
    with _open(uri, storage_options, progress) as reader:
        info = reader.info
        report = ObjectReport(
            uri=uri,
            kind="empty",
            size=info.size,
            modified=info.modified,
            recorded_format=info.recorded_format,
            recorded_digest=info.recorded_digest,
        )
        if info.size == 0:
            return report
        kind, compressed, stream = classify(reader)
        members = None
        try:
            if kind == "archive":
                members = archive.list_members(stream, compressed=compressed)
            elif verify:
                while stream.read(_CHUNK):
                    pass
        except CheckpointCorruptError as exc:
            raise type(exc)(f"checkpoint {uri} is damaged: {exc}") from exc
        verified = True if reader.verified else None
        return report.model_copy(update={"kind": kind, "verified": verified, "members": members})


def restore_to(
    uri: str,
    target: Path,
    *,
    storage_options: StorageOptions | None = None,
    force: bool = False,
    limits: ExtractionLimits | None = None,
    progress: ProgressCallback | None = None,
) -> Path:
    """What ``load`` does, into ``target``: the tree for an archive, ``target/payload`` otherwise.

    Refuses a non-empty ``target`` unless ``force``. The object is restored into a temporary
    directory beside ``target`` first and moved in only when it is complete and verified, so a
    failure never leaves a half-restored tree in ``target``.
    """
    target = target.absolute()
    if target.exists() and not target.is_dir():
        raise InvalidCheckpointInputError(f"{target} is a file; name a directory to restore into")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise InvalidCheckpointInputError(
            f"{target} is not empty; choose an empty directory or pass --force to write into it"
        )
    with translated_os_errors(str(target), "restoring"):
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".flyte-cp-get-", dir=target.parent))
    try:
        with _open(uri, storage_options, progress) as reader:
            if reader.info.size == 0:
                raise CheckpointNotFoundError(f"the object at {uri} is empty, which means no checkpoint")
            restored = restore_object(reader, staging, limits=limits or ExtractionLimits())
        with translated_os_errors(str(target), "restoring"):
            for entry in sorted(staging.iterdir()):
                destination = target / entry.name
                if destination.is_dir() and not destination.is_symlink():
                    shutil.rmtree(destination)
                os.replace(entry, destination)
        return target / restored.relative_to(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
