"""What a rank (a process that owns one part) calls: write its part, read it back, restore it.

A part writer is given only the checkpoint directory, the save's version id and its position; it
stores its part itself and leaves an acknowledgement (size, digest, no payload) for the
coordinator's :func:`~flyte_checkpoint.state.commit`. When it fails, it leaves the cause instead,
so the coordinator raises at once rather than waiting for a part that will never come.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

from flyte_checkpoint.context import TaskContext, ctx
from flyte_checkpoint.errors import (
    ConfigurationError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.state.commit import host_name
from flyte_checkpoint.state.components import (
    BYTES_ENCODING,
    FILE_ENCODING,
    PICKLE,
    Component,
    Payload,
    Serializer,
    capture,
    check_regular_file,
    describe_exception,
    kind_of,
)
from flyte_checkpoint.state.failures import label_of
from flyte_checkpoint.state.layout import Layout, check_version_id, part_name
from flyte_checkpoint.state.manifest import AckRecord, Manifest, PartAck, to_json
from flyte_checkpoint.state.objects import fetch_bytes, write_object, write_record
from flyte_checkpoint.state.restore import (
    Staged,
    Target,
    apply_all,
    check_counts,
    record_of,
    stage,
    with_committed,
)
from flyte_checkpoint.state.runtime import (
    DEFAULT_TIMEOUT,
    Deadline,
    LockLike,
    check_timeout,
    held,
    run_bounded,
)
from flyte_checkpoint.storage import StorageOptions

logger = logging.getLogger("flyte_checkpoint")

PartData = bytes | bytearray | memoryview | Path | Component
"""What a rank may store as its part: raw bytes, a local file (as is), or a component."""


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


def write_part(
    checkpoint_dir: str | os.PathLike[str],
    position: int | None,
    data: PartData,
    *,
    version_id: str,
    world_size: int | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> PartAck:
    """Store this process's part of the save ``version_id`` and acknowledge it to the coordinator.

    ``position=None`` uses this process's rank (``RANK``, see :class:`~flyte_checkpoint.TaskContext`).
    ``data`` is raw bytes, a local file ``Path`` (stored as is), or a component: its
    ``state_dict()`` is serialised (under ``lock`` when given), or its ``save_to_path(path)`` writes
    the part. Returns the acknowledgement (position, part id, size, digest); the part's bytes go
    straight to storage, never through the coordinator.

    On failure the cause is recorded for the coordinator, whose :func:`commit` then raises at
    once naming this part, and the error is re-raised here.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    version = check_version_id(version_id)
    index, _ = resolve_position(position, world_size)
    deadline = Deadline(check_timeout(timeout))
    ack_uri = layout.ack_uri(version, index)
    name = part_name(index)
    try:
        with tempfile.TemporaryDirectory(prefix="flyte-cp-state-") as scratch:
            payload = _payload_of(data, serializer, Path(scratch) / name, lock, deadline, index)
            written = write_object(layout.backend, layout.object_uri(version, name), payload)
        ack = PartAck(
            position=index,
            name=name,
            part_id=uuid.uuid4().hex,
            size=written.size,
            digest=written.digest,
            encoding=payload.encoding,
        )
        record = AckRecord(position=index, ok=True, part=ack, pid=os.getpid(), host=host_name())
        write_record(layout.backend, ack_uri, to_json(record))
    except BaseException as exc:
        _acknowledge_failure(layout, ack_uri, index, exc)
        raise
    return ack


def _payload_of(
    data: object, serializer: Serializer, path: Path, lock: LockLike | None, deadline: Deadline, position: int
) -> Payload:
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
    # The component's own exception propagates unchanged: this process is its owner, and the
    # coordinator receives it (type and message) through the failure acknowledgement.
    with held(lock, deadline, "the part was not written"):
        return capture(data, kind, serializer, path)


def _acknowledge_failure(layout: Layout, ack_uri: str, position: int, exc: BaseException) -> None:
    """Leave the cause where the coordinator looks, so it fails at once instead of timing out."""
    with contextlib.suppress(Exception):
        record = AckRecord(
            position=position, ok=False, error=describe_exception(exc), pid=os.getpid(), host=host_name()
        )
        write_record(layout.backend, ack_uri, to_json(record))


def read_part(
    checkpoint_dir: str | os.PathLike[str],
    position: int | None = None,
    *,
    version_id: str | None = None,
    world_size: int | None = None,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> bytes:
    """The bytes of one part of the committed checkpoint, checked against the manifest's digest.

    ``position=None`` reads this process's rank, and then the checkpoint's part count must equal
    ``WORLD_SIZE`` (or ``world_size`` when given). ``version_id`` (e.g. from the coordinator's
    :func:`verify_checkpoint`) pins the version every rank reads; it must still be the
    committed one.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    index, size = resolve_position(position, world_size)
    deadline = Deadline(check_timeout(timeout))

    def read(manifest: Manifest) -> bytes:
        _check_rank_count(layout, manifest, index, size)
        record = record_of(manifest, index)
        uri = layout.object_uri(manifest.version_id, record.name)
        return run_bounded(
            [(index, lambda: fetch_bytes(layout.backend, uri, record, label_of(index)))],
            deadline=deadline,
            max_workers=1,
            what=f"reading {label_of(index)} of {layout.root}",
            consequence="nothing was read",
        )[0]

    return with_committed(layout, version_id, read)[1]


def _check_rank_count(layout: Layout, manifest: Manifest, index: int, size: int | None) -> None:
    if size is not None:
        check_counts(layout, manifest, parts=size, controller=None)
    if index >= manifest.world_size:
        raise InvalidCheckpointInputError(
            f"checkpoint {layout.root} has {manifest.world_size} parts, so it has no part {index}"
        )


def load_part(
    checkpoint_dir: str | os.PathLike[str],
    position: int | None,
    component: Component,
    *,
    version_id: str | None = None,
    world_size: int | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Restore ``component`` from one part of the committed checkpoint; returns the user metadata.

    The part is fetched, verified and decoded before the component is touched; if applying it
    fails, the component is rolled back to its previous state. Positions and ``version_id``
    work as in :func:`read_part`.
    """
    return _load_one(
        checkpoint_dir,
        position=position,
        component=component,
        version_id=version_id,
        world_size=world_size,
        lock=lock,
        serializer=serializer,
        storage_options=storage_options,
        timeout=timeout,
    )


def load_controller(
    checkpoint_dir: str | os.PathLike[str],
    controller: Component,
    *,
    version_id: str | None = None,
    world_size: int | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Restore the coordinator's ``controller`` alone (its ranks restore their own parts).

    ``world_size``, when given, must equal the checkpoint's part count. Returns the user metadata.
    """
    return _load_one(
        checkpoint_dir,
        position=None,
        component=controller,
        version_id=version_id,
        world_size=world_size,
        lock=lock,
        serializer=serializer,
        storage_options=storage_options,
        timeout=timeout,
        is_controller=True,
    )


def _load_one(
    checkpoint_dir: str | os.PathLike[str],
    *,
    position: int | None,
    component: object,
    version_id: str | None,
    world_size: int | None,
    lock: LockLike | None,
    serializer: Serializer,
    storage_options: StorageOptions | None,
    timeout: float,
    is_controller: bool = False,
) -> dict[str, Any]:
    layout = Layout.of(checkpoint_dir, storage_options)
    if is_controller:
        index: int | None = None
        size = world_size
        kind = kind_of(component, label_of(None))
    else:
        index, size = resolve_position(position, world_size)
        kind = kind_of(component, label_of(index))
    target = Target(index, component, kind)
    deadline = Deadline(check_timeout(timeout))
    with tempfile.TemporaryDirectory(prefix="flyte-cp-state-") as scratch:

        def stage_one(manifest: Manifest) -> list[Staged]:
            if is_controller:
                if size is not None:
                    check_counts(layout, manifest, parts=size, controller=None)
                check_counts(layout, manifest, parts=manifest.world_size, controller=True)
            else:
                assert index is not None
                _check_rank_count(layout, manifest, index, size)
            return stage(
                layout,
                manifest,
                [target],
                serializer=serializer,
                scratch=Path(scratch),
                deadline=deadline,
                max_workers=1,
            )

        manifest, staged = with_committed(layout, version_id, stage_one)
        apply_all(
            staged, serializer=serializer, lock=lock, deadline=deadline, scratch=Path(scratch) / "prior"
        )
    metadata: dict[str, Any] = dict(manifest.metadata)
    return metadata
