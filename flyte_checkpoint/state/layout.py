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

import contextlib
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.storage import Backend, backend_for
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.uris import is_local, local_path

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
    return stripped


def remote_options(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` for an fsspec backend, with its directory-listing cache off.

    fsspec caches listings per filesystem instance and never notices objects that *other*
    processes write, so a coordinator polling for acknowledgements, or a manager listing steps,
    would see a stale view. The caller can still turn the cache on explicitly.
    """
    options = dict(storage_options or {})
    options.setdefault("use_listings_cache", False)
    return options


@dataclass(frozen=True)
class Layout:
    """The URIs of one checkpoint directory and the backend that serves them."""

    root: str
    storage_options: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    backend: Backend = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        options = None if is_local(self.root) else remote_options(self.storage_options)
        object.__setattr__(self, "backend", backend_for(self.root, options))

    @classmethod
    def of(
        cls, checkpoint_dir: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> Layout:
        return cls(_normalised_root(checkpoint_dir), storage_options)

    @property
    def is_local(self) -> bool:
        return is_local(self.root)

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

    @staticmethod
    def version_of(listed_uri: str) -> str | None:
        """The version id in a URI that ``list_prefix`` returned, if it lies in a version directory."""
        marker = f"/{VERSIONS_DIR}/"
        index = listed_uri.rfind(marker)
        if index < 0:
            return None
        version = listed_uri[index + len(marker) :].split("/", 1)[0]
        return version if _VERSION_ID.match(version) else None

    def list_versions(self) -> list[str]:
        """The ids of all version directories, committed or not.

        On local disk the directories themselves are listed, so a version whose only file is
        the temp file of a writer killed mid-write is still found (and collected).
        """
        if self.is_local:
            directory = local_path(self.versions_uri)
            with translated_os_errors(self.versions_uri, "listing"):
                try:
                    names = os.listdir(directory)
                except FileNotFoundError:
                    return []
                return sorted(
                    name for name in names if _VERSION_ID.match(name) and (directory / name).is_dir()
                )
        listed = self.backend.list_prefix(self.versions_uri)
        return sorted({version for uri in listed if (version := self.version_of(uri)) is not None})

    def sync_directories(self, version_id: str) -> None:
        """Make the new version's directory entries durable before the pointer names them.

        Each local object write fsyncs the file and its own directory, but not the directories
        it had to create (``versions/<id>``, ``versions``, and the checkpoint directory itself
        when new), so after a power cut the pointer could name a version whose directory entry
        was lost. Object stores have no directories; nothing to do there.
        """
        if not self.is_local:
            return
        root = local_path(self.root)
        for directory in (root / VERSIONS_DIR / version_id, root / VERSIONS_DIR, root, root.parent):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
