"""The commit pointer: what makes a version the committed one, and reading what is committed.

How a commit is atomic, on every backend: all objects of a save go under a fresh
``versions/<version_id>/`` prefix that no reader looks at; once they are all stored, the one small
pointer object ``COMMITTED.json`` (naming the version and its manifest's sha256) is replaced
through a single atomic object write: a same-directory rename on local disk (after fsync when the
``fsync`` storage option asks for durability), a single PUT on object stores. Before that write
the old checkpoint is the committed one; after it, the new one. A crash at any point leaves
exactly one of them committed and complete. Versions the pointer does not name are then deleted
(garbage collection, best-effort: a crash during it only leaves garbage the next commit removes).

Single writer: one coordinator at a time saves to a checkpoint directory. Readers may run during
a save: a reader whose version is collected under its feet re-reads the pointer and retries.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

from flyte_checkpoint.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError
from flyte_checkpoint.state.layout import MANIFEST_NAME, Layout
from flyte_checkpoint.state.manifest import CommitPointer, Manifest, from_json, sha256_hex, to_json
from flyte_checkpoint.state.objects import read_record, write_record

logger = logging.getLogger("flyte_checkpoint")

T = TypeVar("T")

_STABLE_READ_ATTEMPTS = 3


def read_pointer(layout: Layout) -> CommitPointer | None:
    """The commit pointer, or ``None`` when nothing was ever committed here."""
    data = read_record(layout.backend, layout.pointer_uri)
    return None if data is None else from_json(CommitPointer, data, layout.pointer_uri)


def read_committed(layout: Layout) -> Manifest:
    """The committed manifest, checked against the pointer's digest.

    Raises :class:`CheckpointNotFoundError` when nothing is committed (saying so when an
    uncommitted save left files) and :class:`CheckpointCorruptError` when the pointer or the
    manifest is damaged.
    """
    for _ in range(_STABLE_READ_ATTEMPTS):
        pointer = read_pointer(layout)
        if pointer is None:
            if layout.list_versions():
                raise CheckpointNotFoundError(
                    f"no committed checkpoint at {layout.root}: it holds the files of a save that "
                    "was interrupted or is still running, but none was ever committed"
                )
            raise CheckpointNotFoundError(f"no checkpoint at {layout.root}")
        uri = layout.object_uri(pointer.version_id, MANIFEST_NAME)
        data = read_record(layout.backend, uri)
        if data is None:
            if pointer_moved(layout, pointer.version_id):
                continue
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: its committed manifest {uri} is missing"
            )
        if len(data) != pointer.manifest_size or sha256_hex(data) != pointer.manifest_sha256:
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: the sha256 of {uri} does not match the "
                "one the commit pointer recorded"
            )
        manifest = from_json(Manifest, data, uri)
        if manifest.version_id != pointer.version_id:
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: {uri} describes version "
                f"{manifest.version_id}, not {pointer.version_id}"
            )
        return manifest
    raise CheckpointError(f"checkpoint {layout.root} kept changing while it was being read; retry")


def pointer_moved(layout: Layout, version_id: str) -> bool:
    """Whether a newer commit replaced ``version_id`` (so a failed read of it may be retried)."""
    with contextlib.suppress(CheckpointError):
        current = read_pointer(layout)
        return current is not None and current.version_id != version_id
    return False


def with_committed(
    layout: Layout, version_id: str | None, action: Callable[[Manifest], T]
) -> tuple[Manifest, T]:
    """Run ``action`` on the committed manifest; retry when a concurrent commit replaced it.

    When ``version_id`` is given it must still be the committed version. A save that commits
    while this reads deletes the version being read; the read then fails on a missing object,
    the pointer shows a newer version, and (with no version pinned) the read starts over on it.
    """
    for attempt in range(1, _STABLE_READ_ATTEMPTS + 1):
        manifest = read_committed(layout)
        if version_id is not None and manifest.version_id != version_id:
            raise CheckpointNotFoundError(
                f"version {version_id} is not the committed checkpoint at {layout.root} (that is "
                f"{manifest.version_id}); a newer save replaced it"
            )
        try:
            return manifest, action(manifest)
        except CheckpointCorruptError:
            if (
                attempt < _STABLE_READ_ATTEMPTS
                and version_id is None
                and pointer_moved(layout, manifest.version_id)
            ):
                logger.info("checkpoint %s was replaced while being read; reading the new one", layout.root)
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def publish(layout: Layout, version_id: str, manifest_bytes: bytes) -> None:
    """The commit point: atomically replace the pointer, then collect older versions.

    Called only when every object of the version is stored. If the pointer write fails, the
    version is kept (the write may still have landed); the next commit collects it if it did not.
    """
    pointer = CommitPointer(
        version_id=version_id,
        manifest_sha256=sha256_hex(manifest_bytes),
        manifest_size=len(manifest_bytes),
        committed=datetime.now(timezone.utc),
    )
    # One atomic object write (rename on local disk, single PUT on object stores); writing the
    # same pointer twice is harmless, so a retried write after a lost reply is safe.
    write_record(layout.backend, layout.pointer_uri, to_json(pointer))
    collect_garbage(layout, keep=version_id)


def discard_version(layout: Layout, version_id: str) -> None:
    """Remove an uncommitted version's objects, best-effort (garbage collection retries later)."""
    try:
        pointer = read_pointer(layout)
        if pointer is not None and pointer.version_id == version_id:
            return
        layout.backend.delete_prefix(layout.version_uri(version_id))
    except CheckpointError as exc:
        logger.warning("could not remove the uncommitted version %s: %s", layout.version_uri(version_id), exc)


def collect_garbage(layout: Layout, *, keep: str) -> list[str]:
    """Delete every version except ``keep`` and the committed one; returns the deleted ids.

    Best-effort: a failure is logged, never raised, because the checkpoint is already committed.
    """
    deleted: list[str] = []
    try:
        pointer = read_pointer(layout)
        keep_ids = {keep} | ({pointer.version_id} if pointer is not None else set())
        for version in layout.list_versions():
            if version not in keep_ids:
                layout.backend.delete_prefix(layout.version_uri(version))
                deleted.append(version)
    except CheckpointError as exc:
        logger.warning(
            "could not remove old versions under %s (the next commit retries): %s", layout.versions_uri, exc
        )
    return deleted
