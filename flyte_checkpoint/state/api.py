"""The function forms of :class:`~flyte_checkpoint.state.StateCheckpoint`'s methods.

Each builds a ``StateCheckpoint`` from its ``checkpoint_dir`` and configuration keywords and
calls the method of the same name; see the method for what it does. Code that makes several
calls on one checkpoint can hold a ``StateCheckpoint`` instead and give the configuration once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.state.acks import Worker
from flyte_checkpoint.state.checkpoint import StateCheckpoint
from flyte_checkpoint.state.components import PICKLE, Component, ComponentOrActor, Serializer
from flyte_checkpoint.state.manifest import Manifest, PartAck
from flyte_checkpoint.state.parts import PartData
from flyte_checkpoint.state.waiting import DEFAULT_TIMEOUT, LockLike
from flyte_checkpoint.storage import StorageOptions

Directory = str | os.PathLike[str]


def save_checkpoint(
    checkpoint_dir: Directory,
    *,
    controller: ComponentOrActor | None,
    parts: Sequence[ComponentOrActor],
    metadata: dict[str, Any] | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
) -> Manifest:
    """Save ``controller`` and ``parts`` as one checkpoint; see :meth:`StateCheckpoint.save`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir,
        storage_options=storage_options,
        serializer=serializer,
        timeout=timeout,
        max_workers=max_workers,
    )
    return checkpoint.save(
        controller=controller, parts=parts, metadata=metadata, lock=lock, progress=progress
    )


def load_checkpoint(
    checkpoint_dir: Directory,
    *,
    controller: ComponentOrActor | None,
    parts: Sequence[ComponentOrActor],
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Restore ``controller`` and ``parts``; returns the user metadata. See :meth:`StateCheckpoint.load`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir,
        storage_options=storage_options,
        serializer=serializer,
        timeout=timeout,
        max_workers=max_workers,
    )
    return dict(checkpoint.load(controller=controller, parts=parts, lock=lock, progress=progress).metadata)


def verify_checkpoint(
    checkpoint_dir: Directory,
    *,
    world_size: int | None = None,
    read_parts: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
) -> Manifest:
    """Check the committed checkpoint; see :meth:`StateCheckpoint.verify`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir, storage_options=storage_options, timeout=timeout, max_workers=max_workers
    )
    return checkpoint.verify(world_size=world_size, read_parts=read_parts)


def begin(
    checkpoint_dir: Directory, *, version_id: str | None = None, storage_options: StorageOptions | None = None
) -> str:
    """Start a multi-process save; see :meth:`StateCheckpoint.begin`."""
    return StateCheckpoint(checkpoint_dir, storage_options=storage_options).begin(version_id)


def write_part(
    checkpoint_dir: Directory,
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
    """Store this process's part and leave its acknowledgement in storage for :func:`commit`.

    See :meth:`StateCheckpoint.write_part` (here with ``record_ack=True``).
    """
    checkpoint = StateCheckpoint(
        checkpoint_dir, storage_options=storage_options, serializer=serializer, timeout=timeout
    )
    return checkpoint.write_part(
        position, data, version_id=version_id, world_size=world_size, lock=lock, record_ack=True
    )


def commit(
    checkpoint_dir: Directory,
    version_id: str,
    *,
    world_size: int,
    controller: PartData | None = None,
    metadata: dict[str, Any] | None = None,
    workers: Mapping[int, Worker] | Sequence[Worker] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    poll_interval: float = 0.02,
) -> Manifest:
    """Wait for the parts' acknowledgements in storage, then commit; see :meth:`StateCheckpoint.commit`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir, storage_options=storage_options, serializer=serializer, timeout=timeout
    )
    return checkpoint.commit(
        version_id,
        world_size=world_size,
        controller=controller,
        metadata=metadata,
        workers=workers,
        lock=lock,
        poll_interval=poll_interval,
    )


def read_part(
    checkpoint_dir: Directory,
    position: int | None = None,
    *,
    version_id: str | None = None,
    world_size: int | None = None,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> bytes:
    """The bytes of one part; see :meth:`StateCheckpoint.read_part`."""
    checkpoint = StateCheckpoint(checkpoint_dir, storage_options=storage_options, timeout=timeout)
    return checkpoint.read_part(position, version_id=version_id, world_size=world_size)


def load_part(
    checkpoint_dir: Directory,
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
    """Restore one part; returns the user metadata. See :meth:`StateCheckpoint.load_part`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir, storage_options=storage_options, serializer=serializer, timeout=timeout
    )
    manifest = checkpoint.load_part(
        position, component, version_id=version_id, world_size=world_size, lock=lock
    )
    return dict(manifest.metadata)


def load_controller(
    checkpoint_dir: Directory,
    controller: Component,
    *,
    version_id: str | None = None,
    world_size: int | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Restore the controller; returns the user metadata. See :meth:`StateCheckpoint.load_controller`."""
    checkpoint = StateCheckpoint(
        checkpoint_dir, storage_options=storage_options, serializer=serializer, timeout=timeout
    )
    manifest = checkpoint.load_controller(controller, version_id=version_id, world_size=world_size, lock=lock)
    return dict(manifest.metadata)
