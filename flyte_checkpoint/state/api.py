"""Saving and loading a whole multi-part checkpoint from one process.

``save_checkpoint`` captures every component's state as one consistent snapshot (a prepare phase
under the caller's lock or pause hook) before writing any byte, writes the parts concurrently
under a fresh version, and commits by replacing the pointer (see :mod:`.commit`).
``load_checkpoint`` validates everything before touching any state, then applies all or nothing
(see :mod:`.restore`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flyte_checkpoint.errors import CheckpointCorruptError, InvalidCheckpointInputError, UnsupportedTypeError
from flyte_checkpoint.state.commit import discard_version, publish, store_controller, write_manifest
from flyte_checkpoint.state.components import (
    PICKLE,
    Component,
    Payload,
    Serializer,
    capture,
    describe_exception,
    kind_of,
)
from flyte_checkpoint.state.failures import label_of, part_failed
from flyte_checkpoint.state.layout import CONTROLLER_NAME, Layout, new_version_id, part_name
from flyte_checkpoint.state.manifest import Manifest, PartAck, PartRecord, checked_metadata
from flyte_checkpoint.state.objects import verify_object, write_object
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

NOTHING_SAVED = "nothing was saved; the previous checkpoint is unchanged"


def _targets(controller: object | None, parts: Sequence[object]) -> list[Target]:
    if isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
        raise UnsupportedTypeError(
            f"parts must be a sequence of components (list or tuple), not {type(parts).__name__}"
        )
    targets = (
        [Target(None, controller, kind_of(controller, label_of(None)))] if controller is not None else []
    )
    targets += [Target(index, part, kind_of(part, label_of(index))) for index, part in enumerate(parts)]
    return targets


def save_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    controller: Component | None,
    parts: Sequence[Component],
    metadata: dict[str, Any] | None = None,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
) -> Manifest:
    """Save ``controller`` and ``parts`` (by position) as one checkpoint at ``checkpoint_dir``.

    ``checkpoint_dir`` is a local path or any supported storage URI; an existing checkpoint
    there is replaced atomically: until the new one is committed the old one stays loadable,
    and a crash at any point leaves one of the two, never neither.

    Consistency: every component's state is captured first, inside ``lock`` (a lock, or a pause
    hook: a callable returning a context manager), and only then is any byte written; a
    mutation that takes the same lock can therefore never produce a checkpoint mixing states.
    ``state_dict()`` results are serialised inside the lock, because they may reference live
    objects. ``metadata`` (JSON values) is stored in ``metadata.json`` and returned by loads.

    Every wait is bounded by ``timeout`` seconds (the lock, the part writes); a part that fails
    makes this raise, naming it and the cause, with nothing committed. Returns the manifest.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    targets = _targets(controller, parts)
    user_metadata = checked_metadata(metadata)
    deadline = Deadline(check_timeout(timeout))
    with tempfile.TemporaryDirectory(prefix="flyte-cp-state-") as scratch:
        # Prepare: one consistent snapshot of every component, before any byte is written.
        with held(lock, deadline, NOTHING_SAVED):
            payloads = [_capture(target, serializer, Path(scratch)) for target in targets]
        version = new_version_id()
        try:
            jobs = [
                (target.position, _store_job(layout, version, target.position, payload))
                for target, payload in zip(targets, payloads, strict=True)
            ]
            records = run_bounded(
                jobs,
                deadline=deadline,
                max_workers=max_workers,
                what=f"saving {layout.root}",
                consequence=NOTHING_SAVED,
            )
            controller_record = records.pop(0) if controller is not None else None
            acks = [record for record in records if isinstance(record, PartAck)]
            manifest, manifest_bytes = write_manifest(
                layout, version, controller=controller_record, parts=acks, metadata=user_metadata
            )
        except BaseException:
            discard_version(layout, version)
            raise
    publish(layout, version, manifest_bytes)
    return manifest


def _capture(target: Target, serializer: Serializer, scratch: Path) -> Payload:
    name = CONTROLLER_NAME if target.position is None else part_name(target.position)
    try:
        return capture(target.component, target.kind, serializer, scratch / name)
    except Exception as exc:
        raise part_failed(
            target.position, f"capturing its state raised {describe_exception(exc)}", NOTHING_SAVED
        ) from exc


def _store_job(
    layout: Layout, version: str, position: int | None, payload: Payload
) -> Callable[[], PartRecord]:
    def store() -> PartRecord:
        if position is None:
            return store_controller(layout, version, payload)
        name = part_name(position)
        written = write_object(layout.backend, layout.object_uri(version, name), payload)
        return PartAck(
            position=position,
            name=name,
            part_id=os.urandom(16).hex(),
            size=written.size,
            digest=written.digest,
            encoding=payload.encoding,
        )

    return store


def load_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    controller: Component | None,
    parts: Sequence[Component],
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
) -> dict[str, Any]:
    """Restore ``controller`` and ``parts`` (by position) from the committed checkpoint.

    Validates before touching any state, in this order: the checkpoint exists
    (``FileNotFoundError``), it is committed (``FileNotFoundError`` saying a save never
    committed), the part count equals ``len(parts)`` (``ValueError`` naming both counts), and
    every part is present and matches its recorded size and digest
    (:class:`~flyte_checkpoint.CheckpointCorruptError`). Every part is fetched and decoded first;
    only then are the states applied, under ``lock`` when given. If applying any part fails, every
    component is rolled back to exactly what it held before. Returns the user metadata.
    """
    manifest = load_manifest_and_apply(
        checkpoint_dir,
        controller=controller,
        parts=parts,
        lock=lock,
        serializer=serializer,
        timeout=timeout,
        max_workers=max_workers,
        storage_options=storage_options,
    )
    metadata: dict[str, Any] = dict(manifest.metadata)
    return metadata


def load_manifest_and_apply(
    checkpoint_dir: str | os.PathLike[str],
    *,
    controller: object | None,
    parts: Sequence[object],
    lock: LockLike | None,
    serializer: Serializer,
    timeout: float,
    max_workers: int | None,
    storage_options: StorageOptions | None,
) -> Manifest:
    """:func:`load_checkpoint`, returning the manifest that was applied."""
    layout = Layout.of(checkpoint_dir, storage_options)
    targets = _targets(controller, parts)
    deadline = Deadline(check_timeout(timeout))
    with tempfile.TemporaryDirectory(prefix="flyte-cp-state-") as scratch:

        def stage_all(manifest: Manifest) -> list[Staged]:
            check_counts(layout, manifest, parts=len(parts), controller=controller is not None)
            return stage(
                layout,
                manifest,
                targets,
                serializer=serializer,
                scratch=Path(scratch),
                deadline=deadline,
                max_workers=max_workers,
            )

        manifest, staged = with_committed(layout, None, stage_all)
        apply_all(
            staged, serializer=serializer, lock=lock, deadline=deadline, scratch=Path(scratch) / "prior"
        )
    return manifest


def verify_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    *,
    world_size: int | None = None,
    read_parts: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    max_workers: int | None = None,
    storage_options: StorageOptions | None = None,
) -> Manifest:
    """Check the committed checkpoint without restoring anything; returns its manifest.

    Raises like :func:`load_checkpoint`: not found, not committed, a part count other than
    ``world_size`` (when given), a part missing or not matching its recorded size and digest.
    ``read_parts=False`` checks each part's presence and size only (plus its digest where the
    backend records one), without reading the parts. A coordinator can verify first, then hand
    ``manifest.version_id`` to its ranks' :func:`load_part` so all of them read the same version.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    deadline = Deadline(check_timeout(timeout))
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)):
        raise InvalidCheckpointInputError(f"world_size must be an int, not {world_size!r}")

    def check(manifest: Manifest) -> None:
        if world_size is not None:
            check_counts(layout, manifest, parts=world_size, controller=None)
        positions: list[int | None] = [None] if manifest.controller is not None else []
        positions += list(range(manifest.world_size))
        run_bounded(
            [(position, _verify_job(layout, manifest, position, read_parts)) for position in positions],
            deadline=deadline,
            max_workers=max_workers,
            what=f"verifying {layout.root}",
            consequence="the checkpoint cannot be loaded",
        )

    return with_committed(layout, None, check)[0]


def _verify_job(layout: Layout, manifest: Manifest, position: int | None, read: bool) -> Callable[[], None]:
    record = record_of(manifest, position)
    uri = layout.object_uri(manifest.version_id, record.name)
    label = label_of(position)

    def verify() -> None:
        if read:
            verify_object(layout.backend, uri, record, label)
            return
        info = layout.backend.info(uri)
        if info is None:
            raise CheckpointCorruptError(
                f"{label} is missing: the manifest names {uri}, which does not exist"
            )
        if info.size != record.size or (
            info.recorded_digest is not None and info.recorded_digest != record.digest
        ):
            raise CheckpointCorruptError(f"{label} is damaged: {uri} does not match its size or digest")

    return verify
