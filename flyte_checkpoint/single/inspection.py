"""Looking at a stored checkpoint without a task: describe it, verify it, or restore it anywhere."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
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
from flyte_checkpoint.single.transfer import (
    DEFAULT_RETRY,
    classify,
    holds_checkpoint,
    load_object,
    read_object,
)
from flyte_checkpoint.storage import COPY_CHUNK, ObjectInfo, StorageOptions, VerifyingReader, backend_for
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.storage.stores.local import make_directories
from flyte_checkpoint.tree_removal import remove_tree
from flyte_checkpoint.uris import check_object_uri

logger = logging.getLogger("flyte_checkpoint")


class ObjectReport(BaseModel):
    """What ``flyte-checkpoint inspect`` says about one stored object."""

    model_config = ConfigDict(frozen=True)

    uri: str
    kind: Literal["archive", "payload", "manifest", "empty"]
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
    transfer: TransferSettings | None = None,
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
                # The limits a load applies, so that verify and load never disagree.
                limits = ExtractionLimits().for_recorded(info.recorded_content_size)
                members = archive.list_members(stream, compressed=compressed, limits=limits)
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
    backend = backend_for(uri, storage_options, transfer=transfer)
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
    if kind == "manifest":
        not_checked.append("the chunks the manifest lists (`get` fetches and checks each)")
    if info.recorded_digest is None:
        not_checked.append(
            f"content digest and size: none is recorded with the object ({_why_unrecorded(info)})"
        )
    return {"checked": checked, "not_checked": not_checked}


def _why_unrecorded(info: ObjectInfo) -> str:
    """Why an object has no digest and size on record, as far as its metadata tells, truthfully."""
    if info.recorded_format == "archive":
        # This package wrote it (the format is on record), as a multipart upload of unknown
        # length: S3 takes metadata when an upload starts, before the digest exists.
        return (
            "this package wrote it as a directory archive streamed to a store that takes metadata "
            "only when an upload starts, so its digest could not go with it; the gzip CRC and "
            "length were checked instead, which catch damage inside the archive"
        )
    if info.recorded_format is not None:
        return "its format is recorded but not its digest: it was written by an older version, or rewritten"
    return (
        "nothing of this package is recorded with it: another tool wrote it, or rewrote it in place; "
        "damage its format cannot detect goes unnoticed"
    )


def restore_to(
    uri: str,
    target: Path,
    *,
    storage_options: StorageOptions | None = None,
    transfer: TransferSettings | None = None,
    force: bool = False,
    limits: ExtractionLimits | None = None,
    progress: ProgressCallback | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> Path:
    """What ``load`` does, into ``target``: the tree for an archive, ``target/payload`` otherwise.

    Refuses a non-empty ``target`` unless ``force``; with ``force`` the checkpoint's entries
    replace same-named ones and the others stay. Transient storage failures are retried within
    ``retry``, as a task's load does.

    All or nothing, as far as the filesystem allows: the object is restored into a staging
    directory beside ``target``, the entries of ``target`` the checkpoint does not replace are
    moved into it, and the two directories are swapped by renames, each step undone if a later
    one fails. So a failure leaves ``target`` as it was, and a ``target`` this call created
    (with any parents it made) is removed again. Readers of ``target`` during the swap may see
    it briefly without its kept entries or absent.
    """
    check_object_uri(uri)
    target = target.absolute()
    if target.is_symlink() and target.is_dir():
        target = target.resolve()  # swap the real directory; the link keeps pointing at it
    if target.exists() and not target.is_dir():
        raise InvalidCheckpointInputError(f"{target} is a file; name a directory to restore into")
    existed = target.exists()
    if existed and any(target.iterdir()) and not force:
        raise InvalidCheckpointInputError(
            f"{target} is not empty; choose an empty directory or pass --force to write into it"
        )
    with translated_os_errors(str(target), "restoring"):
        created = make_directories(target.parent)
    try:
        with translated_os_errors(str(target), "restoring"):
            staging = _new_directory_beside(target, ".flyte-cp-get-")
        holds_user_entries: list[bool] = []
        try:
            restored = _restore_into(uri, staging, storage_options, transfer, limits, progress, retry)
            with translated_os_errors(str(target), "restoring"):
                if existed:
                    os.chmod(staging, stat.S_IMODE(target.stat().st_mode))
                    _swap_in(staging, target, holds_user_entries)
                else:
                    os.rename(staging, target)
            return target / restored.relative_to(staging)
        finally:
            if not holds_user_entries:
                with contextlib.suppress(OSError):
                    remove_tree(str(staging))
    except BaseException:
        for directory in reversed(created):  # innermost first; only what this call made
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


def _restore_into(
    uri: str,
    staging: Path,
    storage_options: StorageOptions | None,
    transfer: TransferSettings | None,
    limits: ExtractionLimits | None,
    progress: ProgressCallback | None,
    retry: RetryPolicy,
) -> Path:
    def reset() -> None:
        remove_tree(str(staging))
        staging.mkdir()

    backend = backend_for(uri, storage_options, transfer=transfer)
    restored = load_object(backend, uri, staging, reset=reset, limits=limits, retry=retry, progress=progress)
    if restored is None:
        raise CheckpointNotFoundError(
            f"no checkpoint at {uri} (there is no object, or an empty one, which means none)"
        )
    return restored


def _swap_in(staging: Path, target: Path, holds_user_entries: list[bool]) -> None:
    """Make ``staging`` (plus ``target``'s entries it does not replace) the new ``target``.

    Every step is a rename within ``target``'s parent; a failure undoes the steps before it.
    Should undoing fail too, the error says where the user's entries are, and
    ``holds_user_entries`` tells the caller to keep ``staging``.
    """
    replaced = {entry.name for entry in staging.iterdir()}
    kept: list[str] = []
    aside = _new_directory_beside(target, ".flyte-cp-old-")
    os.rmdir(aside)  # only its unique name is wanted: rename() needs it free
    try:
        for entry in sorted(target.iterdir()):
            if entry.name not in replaced:
                os.rename(entry, staging / entry.name)
                kept.append(entry.name)
        os.rename(target, aside)
        try:
            os.rename(staging, target)
        except BaseException as exc:
            try:
                os.rename(aside, target)
            except OSError:
                holds_user_entries.append(True)
                add_context(exc, f"could not put {target} back: its entries are in {aside} and {staging}")
            raise
    except BaseException as exc:
        for name in reversed(kept):
            try:
                os.rename(staging / name, target / name)
            except OSError:
                if not holds_user_entries:
                    holds_user_entries.append(True)
                    add_context(
                        exc, f"could not move every entry back into {target}; the rest are in {staging}"
                    )
        raise
    try:
        remove_tree(str(aside))
    except OSError as exc:
        logger.warning(
            "restored into %s, but could not remove the entries it replaced in %s: %r", target, aside, exc
        )


def _new_directory_beside(target: Path, prefix: str) -> Path:
    """A new directory with a unique name beside ``target``, with the mode ``mkdir`` gives."""
    while True:
        candidate = target.parent / f"{prefix}{os.urandom(6).hex()}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
