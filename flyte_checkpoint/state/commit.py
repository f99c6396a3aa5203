"""Committing a version: from the acknowledgements of its stored parts to the pointer.

Every way of saving ends here, in :func:`commit_parts`: a one-process save (whose threads stored
the parts), a coordinator that gathered acknowledgements through storage (:mod:`.acks`), and a
caller that gathered them over its own channel (a torch.distributed process group, Ray actors).
The acknowledgements are checked against the stored objects' metadata (no payload is read), the
manifest is written, and the pointer replaced (see :mod:`.pointer` for why that is atomic). On any
failure before the pointer write nothing is committed and the version's objects are removed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import partial
from typing import Any

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.progress import CombinedProgress
from flyte_checkpoint.state.components import Payload
from flyte_checkpoint.state.failures import part_failed
from flyte_checkpoint.state.layout import (
    CONTROLLER_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    Layout,
    check_version_id,
    new_version_id,
)
from flyte_checkpoint.state.manifest import Flags, Manifest, PartAck, PartRecord, to_json
from flyte_checkpoint.state.objects import write_object, write_record
from flyte_checkpoint.state.pointer import discard_version, publish, read_pointer
from flyte_checkpoint.state.waiting import run_bounded
from flyte_checkpoint.timebounds import Deadline

logger = logging.getLogger("flyte_checkpoint")

NOTHING_COMMITTED = "nothing was committed; the previous checkpoint is unchanged"
_RESERVED_NAMES = {CONTROLLER_NAME, MANIFEST_NAME, METADATA_NAME}


def begin(layout: Layout, version_id: str | None) -> str:
    """A new version id for a save, or the caller's, checked and refused when already committed."""
    if version_id is None:
        return new_version_id()
    chosen = check_version_id(version_id)
    refuse_committed(layout, chosen)
    return chosen


def refuse_committed(layout: Layout, version_id: str) -> None:
    """Re-committing the committed version would rewrite its manifest under a live pointer."""
    try:
        pointer = read_pointer(layout)
    except CheckpointCorruptError as exc:
        logger.warning(
            "ignoring a damaged commit pointer in %s (the next commit replaces it): %s", layout.root, exc
        )
        return
    if pointer is not None and pointer.version_id == version_id:
        raise InvalidCheckpointInputError(
            f"version id {version_id!r} is the committed checkpoint at {layout.root}; every save "
            "needs a new version id (begin() makes one)"
        )


def store_controller(
    layout: Layout, version_id: str, payload: Payload, progress: CombinedProgress | None = None
) -> PartRecord:
    """Store the coordinator's own state in the version."""
    written = write_object(layout.backend, layout.object_uri(version_id, CONTROLLER_NAME), payload, progress)
    return PartRecord(
        name=CONTROLLER_NAME,
        part_id=os.urandom(8).hex(),
        size=written.size,
        digest=written.digest,
        encoding=payload.encoding,
    )


Stored = tuple[PartRecord | None, Sequence[PartAck]]
"""What a save stored: the controller's record (if any) and every part's acknowledgement."""


def commit_parts(
    layout: Layout,
    version_id: str,
    store: Callable[[], Stored],
    *,
    metadata: dict[str, Any],
    deadline: Deadline,
    max_workers: int | None,
    check_stored: bool = True,
) -> Manifest:
    """Run ``store`` (which stores or gathers the version's objects), then commit what it returns.

    ``check_stored``: compare each acknowledgement with its stored object's size (and digest,
    where the backend records one) before committing; a save whose own threads just wrote the
    parts skips it. Any failure removes the version and re-raises; nothing is committed. A
    caller-chosen ``version_id`` must have passed :func:`refuse_committed` first.
    """
    try:
        controller, given = store()
        acks = checked_acks(given)
        if check_stored:
            _check_stored(layout, version_id, acks, deadline, max_workers)
        manifest, manifest_bytes = write_manifest(
            layout, version_id, controller=controller, parts=acks, metadata=metadata
        )
    except BaseException:
        discard_version(layout, version_id)
        raise
    publish(layout, version_id, manifest_bytes)
    return manifest


def checked_acks(acks: object) -> list[PartAck]:
    """``acks`` ordered by position, when they cover positions 0..n-1 exactly once."""
    if isinstance(acks, str | bytes) or not isinstance(acks, Sequence):
        raise UnsupportedTypeError(f"acks must be a sequence of PartAck, not {type(acks).__name__}")
    by_position: dict[int, PartAck] = {}
    names: set[str] = set()
    for ack in acks:
        if not isinstance(ack, PartAck):
            raise UnsupportedTypeError(
                f"acks must hold the PartAck each part writer returned, not {type(ack).__name__}"
            )
        if ack.position in by_position:
            raise InvalidCheckpointInputError(
                f"part {ack.position} is acknowledged twice; {NOTHING_COMMITTED}"
            )
        if ack.name in _RESERVED_NAMES or ack.name in names:
            raise InvalidCheckpointInputError(
                f"part {ack.position} is stored as {ack.name!r}, a name already taken; {NOTHING_COMMITTED}"
            )
        by_position[ack.position] = ack
        names.add(ack.name)
    missing = [position for position in range(len(by_position)) if position not in by_position]
    if missing:
        raise InvalidCheckpointInputError(
            f"{len(by_position)} acknowledgements must cover positions 0..{len(by_position) - 1}, "
            f"but part {missing[0]} has none; {NOTHING_COMMITTED}"
        )
    return [by_position[position] for position in range(len(by_position))]


def _check_stored(
    layout: Layout, version_id: str, acks: Sequence[PartAck], deadline: Deadline, max_workers: int | None
) -> None:
    def check(ack: PartAck) -> None:
        # No payload passes through here: the object's metadata alone is compared.
        info = layout.backend.info(layout.object_uri(version_id, ack.name))
        if info is None:
            raise part_failed(
                ack.position, "it was acknowledged, but its object is missing", NOTHING_COMMITTED
            )
        if info.size != ack.size or (info.recorded_digest is not None and info.recorded_digest != ack.digest):
            raise part_failed(
                ack.position,
                "its stored object does not match its acknowledgement (size or digest)",
                NOTHING_COMMITTED,
            )

    run_bounded(
        [(ack.position, partial(check, ack)) for ack in acks],
        deadline=deadline,
        max_workers=max_workers,
        what=f"checking the parts of {layout.version_uri(version_id)}",
        consequence=NOTHING_COMMITTED,
    )


def write_manifest(
    layout: Layout,
    version_id: str,
    *,
    controller: PartRecord | None,
    parts: Sequence[PartAck],
    metadata: dict[str, Any],
) -> tuple[Manifest, bytes]:
    """Write ``metadata.json`` and ``manifest.json`` of a version whose parts are all stored."""
    flags: Flags = {"controller_saved": controller is not None, "parts_saved": len(parts)}
    manifest = Manifest(
        version_id=version_id,
        created=datetime.now(timezone.utc),
        world_size=len(parts),
        controller=controller,
        parts=tuple(parts),
        flags=flags,
        metadata=metadata,
    )
    summary = {"version_id": version_id, "flags": flags, "user_metadata": metadata}
    write_record(
        layout.backend,
        layout.object_uri(version_id, METADATA_NAME),
        json.dumps(summary, indent=2).encode(),
    )
    manifest_bytes = to_json(manifest)
    write_record(layout.backend, layout.object_uri(version_id, MANIFEST_NAME), manifest_bytes)
    return manifest, manifest_bytes
