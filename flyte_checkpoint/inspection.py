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
    add_context,
)
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.storage import COPY_CHUNK, ObjectInfo, StorageOptions, VerifyingReader, backend_for
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.transfer import DEFAULT_RETRY, classify, holds_checkpoint, load_object, read_object
from flyte_checkpoint.uris import check_object_uri


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
    """``True`` when the whole object was read and every check it has passed; ``None`` if not read.
    :attr:`checked` says which checks those were."""
    checked: list[str] | None = None
    """The checks that passed when the object was read whole (``None`` if it was not)."""
    not_checked: list[str] | None = None
    """What could not be checked, and why: an object without a recorded digest and size (written,
    or rewritten in place, by another tool) is only as sound as its format's own checks."""
    members: list[MemberInfo] | None = None


def inspect_object(
    uri: str,
    *,
    storage_options: StorageOptions | None = None,
    verify: bool = False,
    progress: ProgressCallback | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> ObjectReport:
    """Describe the object at ``uri``; archives are listed from the stream, never extracted.

    Listing an archive reads it whole, which also runs its checks. With ``verify`` a payload is
    read whole too. Transient storage failures are retried within ``retry``. Raises
    :class:`CheckpointNotFoundError` when there is no object and
    :class:`CheckpointCorruptError` when a check fails.
    """

    def describe(reader: VerifyingReader) -> ObjectReport:
        info = reader.info
        report = ObjectReport(
            uri=uri,
            kind="empty",
            size=info.size,
            modified=info.modified,
            recorded_format=info.recorded_format,
            recorded_digest=info.recorded_digest,
        )
        if not holds_checkpoint(info):
            return report
        kind, compressed, stream = classify(reader)
        members = None
        try:
            if kind == "archive":
                members = archive.list_members(stream, compressed=compressed)
            elif verify:
                while stream.read(COPY_CHUNK):
                    pass
        except CheckpointCorruptError as exc:
            add_context(exc, "delete the object or point the source at a sound copy", uri=uri)
            raise
        update: dict[str, object] = {"kind": kind, "members": members}
        if reader.verified:
            update.update(verified=True, **_checks(info, kind, compressed))
        return report.model_copy(update=update)

    check_object_uri(uri)
    backend = backend_for(uri, storage_options)
    report = read_object(backend, uri, describe, retry=retry, progress=progress)
    if report is None:
        raise CheckpointNotFoundError(f"no checkpoint at {uri}")
    return report


def _checks(info: ObjectInfo, kind: str, compressed: bool) -> dict[str, list[str]]:
    """What reading ``info``'s object whole checked, and what it could not."""
    checked: list[str] = []
    if info.recorded_digest is not None:
        checked.append(info.recorded_digest.partition(":")[0])
    if info.recorded_size is not None:
        checked.append("size")
    if kind == "archive":
        checked += ["gzip CRC", "tar structure"] if compressed else ["tar structure"]
    not_checked = []
    if info.recorded_digest is None:
        not_checked.append(
            "content digest and size: none is recorded with the object (it was written, or "
            "rewritten in place, by another tool), so damage its format cannot detect goes unnoticed"
        )
    return {"checked": checked, "not_checked": not_checked}


def restore_to(
    uri: str,
    target: Path,
    *,
    storage_options: StorageOptions | None = None,
    force: bool = False,
    limits: ExtractionLimits | None = None,
    progress: ProgressCallback | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> Path:
    """What ``load`` does, into ``target``: the tree for an archive, ``target/payload`` otherwise.

    Refuses a non-empty ``target`` unless ``force``. The object is restored into a temporary
    directory beside ``target`` first and moved in only when it is complete and verified, so a
    failure never leaves a half-restored tree in ``target``. Transient storage failures are
    retried within ``retry``, as a task's load does.
    """
    check_object_uri(uri)
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

    def reset() -> None:
        shutil.rmtree(staging)
        staging.mkdir()

    try:
        backend = backend_for(uri, storage_options)
        restored = load_object(
            backend, uri, staging, reset=reset, limits=limits, retry=retry, progress=progress
        )
        if restored is None:
            raise CheckpointNotFoundError(
                f"no checkpoint at {uri} (there is no object, or an empty one, which means none)"
            )
        with translated_os_errors(str(target), "restoring"):
            for entry in sorted(staging.iterdir()):
                destination = target / entry.name
                if destination.is_dir() and not destination.is_symlink():
                    shutil.rmtree(destination)
                os.replace(entry, destination)
        return target / restored.relative_to(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
