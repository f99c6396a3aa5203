"""Where every object of a multi-part checkpoint lives, and the backend that reaches it.

::

    checkpoint_dir/
      COMMITTED.json                   the commit pointer: version id + manifest sha256 (written last)
      versions/<version_id>/
        controller.bin                 the coordinator's state
        part-00000.bin ...             one object per part, by position
        acks/part-00000.json ...       part writers' acknowledgements (multi-process saves)
        metadata.json                  flags and user metadata, for people and tools
        manifest.json                  parts by position with ids, sizes and digests

Every save writes a fresh version directory and commits by replacing the one small pointer object,
which is atomic on every backend (a rename on local disk, a single PUT on object stores, which
have no rename). Readers follow only the pointer, so a version is invisible until committed;
versions the pointer does not name are garbage, removed after the next commit.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.storage import Backend, backend_for
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.uris import is_local, scheme_of

POINTER_NAME = "COMMITTED.json"
VERSIONS_DIR = "versions"
ACKS_DIR = "acks"
CONTROLLER_NAME = "controller.bin"
METADATA_NAME = "metadata.json"
MANIFEST_NAME = "manifest.json"

_VERSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_version_id() -> str:
    """A fresh version id: UTC time (so listings sort by age) and 48 random bits."""
    now = datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:12]}"


def check_version_id(version_id: object) -> str:
    """``version_id`` if it is usable as one path segment on every backend; else a clear error."""
    if not isinstance(version_id, str) or not _VERSION_ID.match(version_id):
        raise InvalidCheckpointInputError(
            f"version id {version_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (begin() makes one for you)"
        )
    return version_id


def part_name(position: int) -> str:
    """The object name of the part at ``position``."""
    return f"part-{position:05d}.bin"


def ack_name(position: int) -> str:
    return f"part-{position:05d}.json"


def _normalised_root(checkpoint_dir: str | os.PathLike[str]) -> str:
    if not isinstance(checkpoint_dir, str | os.PathLike):
        raise InvalidCheckpointInputError(
            f"checkpoint_dir must be a path or a storage URI, not {type(checkpoint_dir).__name__}"
        )
    root = os.fspath(checkpoint_dir).strip()
    if not root:
        raise InvalidCheckpointInputError("checkpoint_dir is empty; give a path or a storage URI")
    stripped = root.rstrip("/")
    if not stripped or stripped.endswith(":"):
        raise InvalidCheckpointInputError(
            f"checkpoint_dir {root!r} names a filesystem or bucket root; give a directory below it"
        )
    if not scheme_of(stripped):
        # Absolute, as of now: listings name absolute paths, and a relative root matched none of
        # them (every step looked uncommitted, loads found nothing, retention deleted nothing).
        return str(Path(stripped).expanduser().absolute())
    return stripped


def _backend_options(root: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` as given (``fsync`` included, on every backend), with fsspec's
    directory-listing cache off for object stores.

    fsspec caches listings per filesystem instance and never notices objects that *other*
    processes write, so a coordinator polling for acknowledgements, or a manager listing steps,
    would see a stale view. The caller can still turn the cache on explicitly.
    """
    options = dict(storage_options or {})
    if not is_local(root):
        options.setdefault("use_listings_cache", False)
    return options


@dataclass(frozen=True)
class Layout:
    """The URIs of one checkpoint directory and the backend that serves them."""

    root: str
    storage_options: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    transfer: TransferSettings | None = field(default=None, compare=False, repr=False)
    backend: Backend = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        options = _backend_options(self.root, self.storage_options)
        object.__setattr__(self, "backend", backend_for(self.root, options, transfer=self.transfer))

    @classmethod
    def of(
        cls,
        checkpoint_dir: str | os.PathLike[str],
        storage_options: Mapping[str, Any] | None = None,
        transfer: TransferSettings | None = None,
    ) -> Layout:
        return cls(_normalised_root(checkpoint_dir), storage_options, transfer)

    def join(self, *names: str) -> str:
        return "/".join((self.root, *names))

    @property
    def pointer_uri(self) -> str:
        return self.join(POINTER_NAME)

    @property
    def versions_uri(self) -> str:
        return self.join(VERSIONS_DIR)

    def version_uri(self, version_id: str) -> str:
        return self.join(VERSIONS_DIR, version_id)

    def object_uri(self, version_id: str, name: str) -> str:
        return self.join(VERSIONS_DIR, version_id, name)

    def acks_uri(self, version_id: str) -> str:
        return self.join(VERSIONS_DIR, version_id, ACKS_DIR)

    def ack_uri(self, version_id: str, position: int) -> str:
        return self.join(VERSIONS_DIR, version_id, ACKS_DIR, ack_name(position))

    def list_versions(self) -> list[str]:
        """The ids of all version directories, committed or not.

        Listed as children of ``versions/``, so a version whose only file is the temp file of a
        writer killed mid-write is still found (and collected) where the backend shows one.
        """
        names = self.backend.list_children(self.versions_uri)
        return sorted(name for name in names if _VERSION_ID.match(name))
