"""The manifest: the one object that makes an incremental save visible, and what it lists.

A manifest is UTF-8 JSON beginning with ``{"format":"flyte-checkpoint-incremental"`` (its magic,
recognised even where the store lost the object's metadata) and a ``version``; a reader refuses
a version it does not know with a message saying to upgrade. It lists every directory, file
(its mode, size and the SHA-256 of each fixed-size chunk) and symbolic link of the saved tree;
the file content lives in the chunk store (:mod:`.layout`), which the manifest names relative
to itself.
"""

from __future__ import annotations

import json
from typing import Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flyte_checkpoint.archive.limits import manifest_limit_hint
from flyte_checkpoint.errors import ArchiveLimitError, CheckpointCorruptError
from flyte_checkpoint.storage import COPY_CHUNK

MANIFEST_FORMAT: Final = "flyte-checkpoint-incremental"
"""The ``format`` field of every manifest, and the object's recorded format."""
MANIFEST_VERSION: Final = 1
MANIFEST_MAGIC = b'{"format":"flyte-checkpoint-incremental"'
"""The first bytes of every manifest."""
DEFAULT_CHUNK_SIZE = 16 << 20
"""Bytes per chunk of a large file: a chunk is read whole into memory to hash and upload it."""


class ChunkRef(BaseModel):
    """One stored chunk of a file: its SHA-256 (hex) and length."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class FileEntry(BaseModel):
    """A regular file: its path below the saved directory, permission bits, size and chunks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    mode: int = Field(ge=0, le=0o7777)
    size: int = Field(ge=0)
    chunks: tuple[ChunkRef, ...]


class DirectoryEntry(BaseModel):
    """A directory (listed so empty ones come back too) and its permission bits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    mode: int = Field(ge=0, le=0o7777)


class LinkEntry(BaseModel):
    """A symbolic link and its target (relative, inside the tree: checked on save and on load)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    target: str


class Manifest(BaseModel):
    """What an incremental save stored: the tree's entries and where their chunks are."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["flyte-checkpoint-incremental"] = MANIFEST_FORMAT
    version: Literal[1] = MANIFEST_VERSION
    chunk_store: str
    """The chunk store, relative to the manifest's directory (see :mod:`.layout`)."""
    chunk_size: int = Field(gt=0)
    directories: tuple[DirectoryEntry, ...] = ()
    files: tuple[FileEntry, ...] = ()
    symlinks: tuple[LinkEntry, ...] = ()

    @property
    def content_size(self) -> int:
        """Bytes of file content the manifest restores to."""
        return sum(entry.size for entry in self.files)

    def digests(self) -> set[str]:
        """The SHA-256 of every chunk it references."""
        return {chunk.sha256 for entry in self.files for chunk in entry.chunks}

    def encode(self) -> bytes:
        """The manifest as stored: compact JSON starting with :data:`MANIFEST_MAGIC`."""
        return self.model_dump_json().encode()


def is_manifest_head(head: bytes) -> bool:
    """Whether an object starting with ``head`` is a manifest (by its magic)."""
    return head.startswith(MANIFEST_MAGIC)


class Readable(Protocol):
    """What a manifest is read from: a store's reader, a file."""

    def read(self, size: int = -1, /) -> bytes: ...


def read_manifest(stream: Readable, uri: str, max_bytes: int, head: bytes = b"") -> Manifest:
    """The manifest of ``uri`` that ``stream`` holds after ``head``, read to its end (so a
    verifying reader checks the recorded digest); :class:`ArchiveLimitError` once it passes
    ``max_bytes`` (:attr:`~flyte_checkpoint.archive.ExtractionLimits.max_manifest_bytes`),
    before more is read."""
    pieces = [head]
    size = len(head)
    while piece := stream.read(min(COPY_CHUNK, max_bytes + 1 - size)):
        pieces.append(piece)
        size += len(piece)
        if size > max_bytes:
            raise ArchiveLimitError(
                f"incremental checkpoint {uri} has a manifest of more than {max_bytes} bytes, over "
                f"the limit (a genuine one lists millions of files); {manifest_limit_hint()}"
            )
    return parse_manifest(b"".join(pieces), uri)


def parse_manifest(data: bytes, uri: str) -> Manifest:
    """The manifest in ``data`` read from ``uri``, or :class:`CheckpointCorruptError` saying why not."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorruptError(
            f"incremental checkpoint {uri} is damaged: its manifest is not JSON ({exc})"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise CheckpointCorruptError(f"checkpoint {uri} is not an incremental checkpoint manifest")
    if raw.get("version") != MANIFEST_VERSION:
        raise CheckpointCorruptError(
            f"incremental checkpoint {uri} has manifest version {raw.get('version')!r}, which this "
            f"flyte_checkpoint (version {MANIFEST_VERSION}) cannot read; upgrade flyte_checkpoint to load it"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise CheckpointCorruptError(
            f"incremental checkpoint {uri} is damaged: its manifest does not validate ({exc.error_count()} "
            "errors); delete it to start fresh or point the source at a sound copy"
        ) from None
