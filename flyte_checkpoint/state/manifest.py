"""The records a multi-part checkpoint is made of: part acknowledgements, the manifest, the pointer.

All are frozen pydantic models stored as JSON. A part writer (possibly another process) returns a
:class:`PartAck`, and may also leave it in storage as an :class:`AckRecord`; the committer
gathers them into a :class:`Manifest`; the :class:`CommitPointer`, written last, names the
committed manifest and its digest, which is what makes a checkpoint exist.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flyte_checkpoint.errors import CheckpointCorruptError, InvalidCheckpointInputError
from flyte_checkpoint.storage.digests import LABELLED_DIGEST_PATTERN

FORMAT_VERSION: Literal[1] = 1
"""The layout version this code writes and reads."""

_SHA256_PATTERN = r"^[0-9a-f]{64}$"

Flags = dict[str, bool | int | str]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PartRecord(_Record):
    """One stored object of a checkpoint: the controller's state or one part."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """The object's name inside its version directory, e.g. ``part-00003.bin``.

    Names, not URIs, so a checkpoint directory copied elsewhere (another bucket, a renamed
    folder) stays loadable.
    """
    part_id: str = Field(min_length=1)
    """A fresh random id per write, telling two writes of the same position apart."""
    size: int = Field(ge=0)
    digest: str = Field(pattern=LABELLED_DIGEST_PATTERN)
    """The labelled digest of the stored bytes (``"crc32:..."``), checked on every load."""
    encoding: str = Field(min_length=1)
    """How the bytes were produced: a serializer's name (``"pickle"``), ``"bytes"`` (raw bytes
    given by the caller) or ``"file"`` (a file the component or caller wrote itself)."""


class PartAck(PartRecord):
    """A part writer's acknowledgement: where its part is and what it holds (no payload)."""

    position: int = Field(ge=0)


class AckRecord(_Record):
    """What a part writer leaves for the coordinator: its acknowledgement, or why it failed."""

    position: int = Field(ge=0)
    ok: bool
    part: PartAck | None = None
    error: str | None = None
    pid: int
    host: str

    @model_validator(mode="after")
    def _consistent(self) -> AckRecord:
        if self.ok and (self.part is None or self.part.position != self.position):
            raise ValueError("a successful acknowledgement must carry its part, at its position")
        if not self.ok and not self.error:
            raise ValueError("a failed acknowledgement must say why")
        return self


class Manifest(_Record):
    """Everything a load needs to find and check every object of one committed version."""

    format_version: Literal[1] = 1
    version_id: str
    created: datetime
    world_size: int = Field(ge=0)
    """How many parts were saved; a load must offer exactly this many."""
    controller: PartRecord | None
    """The coordinator's own state, when one was saved."""
    parts: tuple[PartAck, ...]
    """The parts, ordered by position: ``parts[i].position == i``."""
    flags: Flags = {}
    metadata: dict[str, Any] = {}
    """The caller's metadata, as JSON gave it back."""

    @model_validator(mode="after")
    def _parts_by_position(self) -> Manifest:
        positions = [part.position for part in self.parts]
        if positions != list(range(self.world_size)):
            raise ValueError(f"parts must cover positions 0..{self.world_size - 1} in order, got {positions}")
        names = [part.name for part in self.parts]
        if self.controller is not None:
            names.append(self.controller.name)
        if len(set(names)) != len(names):
            raise ValueError("two records name the same object")
        return self


class CommitPointer(_Record):
    """The commit point: names the committed version and pins its manifest by digest."""

    format_version: Literal[1] = 1
    version_id: str
    manifest_sha256: str = Field(pattern=_SHA256_PATTERN)
    manifest_size: int = Field(ge=0)
    committed: datetime


Model = TypeVar("Model", bound=BaseModel)


def to_json(model: BaseModel) -> bytes:
    """The stored form of a record: indented JSON, so a person can read it."""
    return model.model_dump_json(indent=2).encode()


def from_json(model: type[Model], data: bytes, uri: str) -> Model:
    """Parse a stored record; damage or an unknown format is a :class:`CheckpointCorruptError`."""
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorruptError(f"{uri} is damaged: not valid JSON ({exc})") from exc
    if isinstance(raw, dict):
        version = raw.get("format_version", FORMAT_VERSION)
        if version != FORMAT_VERSION:
            raise CheckpointCorruptError(
                f"{uri} has format version {version!r}, but this flyte_checkpoint reads version "
                f"{FORMAT_VERSION}; load it with the release that wrote it"
            )
    try:
        return model.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise CheckpointCorruptError(
            f"{uri} is damaged: it is not a valid {model.__name__} ({exc.error_count()} problems: "
            f"{_first_error(exc)})"
        ) from exc


def _first_error(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(item) for item in first.get("loc", ())) or "(top level)"
    return f"{where}: {first.get('msg', 'invalid')}"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checked_metadata(metadata: Any) -> dict[str, Any]:
    """The caller's metadata as it will be loaded back (a JSON round trip), checked before saving."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidCheckpointInputError(
            f"metadata must be a dict of JSON values, not {type(metadata).__name__}"
        )
    try:
        encoded = json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidCheckpointInputError(
            f"metadata must be JSON-serialisable (str keys; str, numbers, bools, None, lists, "
            f"dicts; no NaN): {exc}"
        ) from exc
    restored: dict[str, Any] = json.loads(encoded)
    return restored
