"""The part writer's role: turn a rank's data into its part, store it, and read parts back.

A part writer is given only the checkpoint directory, the save's version id and its position; it
stores its part straight to storage and returns an acknowledgement (:class:`PartAck`: size and
digest, no payload) for whoever commits the version.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from flyte_checkpoint.context import TaskContext, ctx
from flyte_checkpoint.errors import ConfigurationError, InvalidCheckpointInputError, UnsupportedTypeError
from flyte_checkpoint.progress import CombinedProgress
from flyte_checkpoint.state.components import (
    BYTES_ENCODING,
    FILE_ENCODING,
    Component,
    Payload,
    Serializer,
    capture,
    check_regular_file,
    kind_of,
)
from flyte_checkpoint.state.failures import label_of
from flyte_checkpoint.state.layout import Layout, part_name
from flyte_checkpoint.state.manifest import Manifest, PartAck
from flyte_checkpoint.state.objects import write_object
from flyte_checkpoint.state.restore import check_counts
from flyte_checkpoint.state.waiting import LockLike, held
from flyte_checkpoint.timebounds import Deadline

PartData = bytes | bytearray | memoryview | Path | Component
"""What may be stored as a part: raw bytes, a local file (as is), or a component."""


def resolve_position(position: int | None, world_size: int | None) -> tuple[int, int | None]:
    """The part's position and the running part count (when known).

    ``position=None`` means "this process's rank": ``RANK`` (and ``WORLD_SIZE``) from the task
    context, as torchrun sets them.
    """
    if position is None:
        context = ctx() or TaskContext()
        rank = context.rank
        size = world_size if world_size is not None else context.world_size
        if rank >= size:
            raise ConfigurationError(
                f"RANK={rank} is not below the world size {size}; check how the process was started"
            )
        return rank, size
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise InvalidCheckpointInputError(f"position must be a non-negative int or None, not {position!r}")
    if world_size is not None and position >= world_size:
        raise InvalidCheckpointInputError(f"position {position} is not below the world size {world_size}")
    return position, world_size


def payload_of(
    data: object,
    serializer: Serializer,
    path: Path,
    *,
    lock: LockLike | None,
    deadline: Deadline,
    position: int | None,
    consequence: str,
) -> Payload:
    """``data`` detached from its owner: bytes as is, a file by its path, a component captured
    (under ``lock``) into bytes or into the file ``path``."""
    if isinstance(data, bytes | bytearray | memoryview):
        return Payload(bytes(data), BYTES_ENCODING)
    if isinstance(data, Path):
        check_regular_file(data, "the file given as part data")
        return Payload(data, FILE_ENCODING)
    if isinstance(data, str):
        raise UnsupportedTypeError(
            "part data given as str is ambiguous: pass Path(...) for a file, or .encode() the text"
        )
    kind = kind_of(data, label_of(position))
    with held(lock, deadline, consequence):
        return capture(data, kind, serializer, path)


def store_part(
    layout: Layout, version_id: str, position: int, payload: Payload, progress: CombinedProgress | None = None
) -> PartAck:
    """Store the part at ``position`` of the version; its acknowledgement."""
    name = part_name(position)
    written = write_object(layout.backend, layout.object_uri(version_id, name), payload, progress)
    return PartAck(
        position=position,
        name=name,
        part_id=uuid.uuid4().hex,
        size=written.size,
        digest=written.digest,
        encoding=payload.encoding,
    )


def check_rank_count(layout: Layout, manifest: Manifest, index: int, size: int | None) -> None:
    """The checkpoint has a part ``index``, and ``size`` parts when the running count is known."""
    if size is not None:
        check_counts(layout, manifest, parts=size, controller=None)
    if index >= manifest.world_size:
        raise InvalidCheckpointInputError(
            f"checkpoint {layout.root} has {manifest.world_size} parts, so it has no part {index}"
        )
