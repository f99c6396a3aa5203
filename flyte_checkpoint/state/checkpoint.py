"""``StateCheckpoint``: one multi-part checkpoint directory and the configuration to reach it.

The configuration (storage options, serializer, time bound, concurrency) is given once; every
operation is a method: a one-process :meth:`~StateCheckpoint.save` and
:meth:`~StateCheckpoint.load`, and the pieces of a multi-process save (:meth:`~StateCheckpoint.begin`,
:meth:`~StateCheckpoint.write_part` in each rank, :meth:`~StateCheckpoint.commit_version` or
:meth:`~StateCheckpoint.commit` in the coordinator) and load.

Over 600 lines by choice: one public class, about 130 lines of it docstrings, whose methods
only put the work of ``commit.py``, ``restore.py``, ``parts.py``, ``acks.py`` and ``layout.py``
in order; splitting it would split the public face it documents.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.lockfiles import locked_scratch_directory
from flyte_checkpoint.progress import CombinedProgress, ProgressCallback, combined, log_transfer
from flyte_checkpoint.state import acks as storage_acks
from flyte_checkpoint.state.commit import (
    NOTHING_COMMITTED,
    Stored,
    begin,
    commit_parts,
    refuse_committed,
    store_controller,
)
from flyte_checkpoint.state.components import (
    PICKLE,
    Component,
    ComponentOrActor,
    Payload,
    Serializer,
    capture,
    describe_exception,
    kind_of,
)
from flyte_checkpoint.state.failures import label_of, part_failed
from flyte_checkpoint.state.layout import CONTROLLER_NAME, Layout, check_version_id, new_version_id, part_name
from flyte_checkpoint.state.manifest import Manifest, PartAck, PartRecord, checked_metadata
from flyte_checkpoint.state.objects import fetch_bytes, verify_object
from flyte_checkpoint.state.parts import PartData, check_rank_count, payload_of, resolve_position, store_part
from flyte_checkpoint.state.pointer import read_committed, with_committed
from flyte_checkpoint.state.restore import Target, check_counts, load_into, record_of
from flyte_checkpoint.state.waiting import (
    DEFAULT_TIMEOUT,
    LockLike,
    check_max_workers,
    check_timeout,
    held,
    run_bounded,
)
from flyte_checkpoint.storage import StorageOptions
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.timebounds import Deadline

NOTHING_SAVED = "nothing was saved; the previous checkpoint is unchanged"


class StateCheckpoint:
    """A multi-part checkpoint at ``root`` (a local path or a storage URI).

    ``storage_options`` reach the backend on every operation, local disk included, and ``transfer``
    gives this package's transfer settings (``TransferSettings(fsync=True)``, or the older
    ``{"fsync": True}`` storage option, makes local writes durable against power loss);
    ``serializer`` turns ``state_dict()`` results into bytes (pickle by default: load only
    checkpoints you trust); ``timeout`` bounds every operation as a whole (locks, part writes, waits
    for ranks), and ``max_workers`` how many parts one process moves at a time.

    A save replaces the committed checkpoint atomically: until the new version's pointer is
    written the old one stays loadable, and a crash at any point leaves one of the two, never
    neither. One writer at a time per directory; readers may run during a save. Picklable, so it
    can be handed to rank processes and Ray actors.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: StorageOptions | None = None,
        transfer: TransferSettings | None = None,
        serializer: Serializer = PICKLE,
        timeout: float = DEFAULT_TIMEOUT,
        max_workers: int | None = None,
    ) -> None:
        self._layout = Layout.of(root, storage_options, transfer)
        self._storage_options = storage_options
        self._transfer = transfer
        self._serializer = serializer
        self._timeout = check_timeout(timeout)
        if max_workers is not None:
            check_max_workers(max_workers, 1)
        self._max_workers = max_workers

    def __reduce__(self) -> tuple[Callable[..., StateCheckpoint], tuple[Any, ...]]:
        # The backend holds clients and threads that do not cross processes: rebuild it there.
        return (
            _rebuild,
            (
                self.root,
                self._storage_options,
                self._serializer,
                self._timeout,
                self._max_workers,
                self._transfer,
            ),
        )

    def __repr__(self) -> str:
        return f"StateCheckpoint({self.root!r})"

    @property
    def root(self) -> str:
        """The checkpoint directory, normalised (no trailing slash)."""
        return self._layout.root

    @property
    def storage_options(self) -> Mapping[str, Any] | None:
        return self._storage_options

    @property
    def transfer(self) -> TransferSettings | None:
        """This package's transfer settings, when given as ``transfer=`` (else they are read from
        :attr:`storage_options`)."""
        return self._transfer

    @property
    def serializer(self) -> Serializer:
        return self._serializer

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def max_workers(self) -> int | None:
        return self._max_workers

    def _deadline(self) -> Deadline:
        return Deadline.after(self._timeout)

    # ----------------------------------------------------------------------- one process

    def save(
        self,
        *,
        controller: ComponentOrActor | None,
        parts: Sequence[ComponentOrActor],
        metadata: dict[str, Any] | None = None,
        lock: LockLike | None = None,
        progress: ProgressCallback | None = None,
    ) -> Manifest:
        """Save ``controller`` and ``parts`` (by position) as one checkpoint; returns its manifest.

        Consistency: every component's state is captured first, inside ``lock`` (a lock, or a
        pause hook: a callable returning a context manager), and only then is any byte written,
        so a mutation that takes the same lock never produces a checkpoint mixing states.
        ``state_dict()`` results are serialised inside the lock, because they may reference live
        objects. ``metadata`` (JSON values) is stored with the manifest and returned by loads.
        A part that fails makes this raise, naming it and the cause, with nothing committed.
        ``progress(bytes_written, total)`` is told how far the parts got, all together (not for
        Ray actors, which each write their own part).

        Ray actor handles may be given as components: each actor then writes its own part (see
        :mod:`flyte_checkpoint.state.ray`).
        """
        if _holds_actors(controller, parts):
            from flyte_checkpoint.state.ray import save_actors

            return save_actors(self, controller=controller, parts=parts, metadata=metadata, lock=lock)
        started = time.monotonic()
        layout = self._layout
        targets = _targets(controller, parts)
        user_metadata = checked_metadata(metadata)
        deadline = self._deadline()
        with locked_scratch_directory("flyte-cp-state-") as scratch:
            # Prepare: one consistent snapshot of every component, before any byte is written.
            with held(lock, deadline, NOTHING_SAVED):
                payloads = [_capture(target, self._serializer, Path(scratch)) for target in targets]
            version = new_version_id()
            told = combined(progress, sum(_payload_size(payload) for payload in payloads))

            def store() -> Stored:
                records = run_bounded(
                    [
                        (target.position, _store_job(layout, version, target.position, payload, told))
                        for target, payload in zip(targets, payloads, strict=True)
                    ],
                    deadline=deadline,
                    max_workers=self._max_workers,
                    what=f"saving {layout.root}",
                    consequence=NOTHING_SAVED,
                )
                if told is not None:
                    told.finish()
                stored_controller = records.pop(0) if controller is not None else None
                return stored_controller, [record for record in records if isinstance(record, PartAck)]

            manifest = commit_parts(
                layout,
                version,
                store,
                metadata=user_metadata,
                deadline=deadline,
                max_workers=self._max_workers,
                check_stored=False,
            )
        _log_checkpoint("saved", layout.root, manifest, started)
        return manifest

    def load(
        self,
        *,
        controller: ComponentOrActor | None,
        parts: Sequence[ComponentOrActor],
        lock: LockLike | None = None,
        progress: ProgressCallback | None = None,
    ) -> Manifest:
        """Restore ``controller`` and ``parts`` (by position); returns the applied manifest.

        Validates before touching any state, in this order: the checkpoint exists
        (``FileNotFoundError``), it is committed (``FileNotFoundError`` saying a save never
        committed), the part count equals ``len(parts)`` (``ValueError`` naming both counts), and
        every part is present and matches its recorded size and digest
        (:class:`~flyte_checkpoint.CheckpointCorruptError`). Every part is fetched and decoded
        first; only then are the states applied, under ``lock`` when given. If applying any part
        fails, every component is rolled back to exactly what it held before. The user metadata
        is ``manifest.metadata``.

        Ray actor handles may be given as components: each actor then loads its own part (see
        :mod:`flyte_checkpoint.state.ray`).
        """
        if _holds_actors(controller, parts):
            from flyte_checkpoint.state.ray import load_actors

            return load_actors(self, controller=controller, parts=parts, lock=lock)
        layout = self._layout
        given_controller = controller is not None

        def check(manifest: Manifest) -> None:
            check_counts(layout, manifest, parts=len(parts), controller=given_controller)

        return self._load(
            _targets(controller, parts), version_id=None, check=check, lock=lock, progress=progress
        )

    def verify(self, *, world_size: int | None = None, read_parts: bool = True) -> Manifest:
        """Check the committed checkpoint without restoring anything; returns its manifest.

        Raises like :meth:`load`: not found, not committed, a part count other than
        ``world_size`` (when given), a part missing or not matching its recorded size and digest.
        ``read_parts=False`` checks each part's presence and size only (plus its digest where the
        backend records one), without reading the parts. A coordinator can verify first, then
        hand ``manifest.version_id`` to its ranks' :meth:`load_part` so all read the same version.
        """
        layout = self._layout
        deadline = self._deadline()
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
                max_workers=self._max_workers,
                what=f"verifying {layout.root}",
                consequence="the checkpoint cannot be loaded",
            )

        return with_committed(layout, None, check)[0]

    def manifest(self) -> Manifest:
        """The committed manifest (checked against the pointer), without reading any part."""
        return read_committed(self._layout)

    # ----------------------------------------------------------------------- several processes

    def begin(self, version_id: str | None = None) -> str:
        """Start a save: the version id every part writer of this save must be given.

        The id names a fresh, invisible directory for this save's objects. A caller-chosen
        ``version_id`` (e.g. ``f"step{step}-attempt{attempt}"``, so ranks know it without being
        told) must be new for every save attempt: acknowledgements left under a reused id by an
        earlier, failed attempt would be taken for this attempt's.
        """
        return begin(self._layout, version_id)

    def write_part(
        self,
        position: int | None,
        data: PartData,
        *,
        version_id: str,
        world_size: int | None = None,
        lock: LockLike | None = None,
        record_ack: bool = False,
    ) -> PartAck:
        """Store one part of the save ``version_id``; returns its acknowledgement.

        ``position=None`` uses this process's rank (``RANK``, see
        :class:`~flyte_checkpoint.TaskContext`). ``data`` is raw bytes, a local file ``Path``
        (stored as is), or a component: its ``state_dict()`` is serialised (under ``lock`` when
        given), or its ``save_to_path(path)`` writes the part. The bytes go straight to storage;
        the returned :class:`PartAck` (position, size, digest) is all the committer needs: give
        the gathered acks to :meth:`commit_version`.

        ``record_ack=True`` also leaves the ack (or, on failure, the cause) in storage for a
        coordinator's :meth:`commit`, which then needs no other channel to the ranks.
        """
        layout = self._layout
        version = check_version_id(version_id)
        index, _ = resolve_position(position, world_size)
        deadline = self._deadline()
        try:
            with locked_scratch_directory("flyte-cp-state-") as scratch:
                # The component's own exception propagates unchanged: this process is its owner.
                payload = payload_of(
                    data,
                    self._serializer,
                    Path(scratch) / part_name(index),
                    lock=lock,
                    deadline=deadline,
                    position=index,
                    consequence="the part was not written",
                )
                ack = store_part(layout, version, index, payload)
            if record_ack:
                storage_acks.record_ack(layout, version, ack)
        except BaseException as exc:
            if record_ack:
                storage_acks.record_failure(layout, version, index, exc)
            raise
        return ack

    def commit_version(
        self,
        version_id: str,
        acks: Sequence[PartAck],
        *,
        controller: PartData | None = None,
        metadata: dict[str, Any] | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Commit the save ``version_id`` from the acknowledgements its part writers returned.

        The commit step for callers that gather the acks themselves (a torch.distributed
        ``finish()``, which receives every rank's results over the process group; Ray actors
        returning them): nothing is polled and no process is watched. ``acks`` must cover
        positions ``0..n-1`` exactly once; each is checked against its stored object's size (and
        digest, where the backend records one) without reading it. ``controller`` (a component,
        bytes or a file) is captured under ``lock`` and stored with the version. Then the
        manifest is written and the pointer replaced.

        On any failure nothing is committed, the previous checkpoint stays the loadable one, and
        this version's objects are removed (best-effort). Returns the committed manifest.
        """
        version = check_version_id(version_id)
        return self._commit(version, lambda _: acks, controller=controller, metadata=metadata, lock=lock)

    def commit(
        self,
        version_id: str,
        *,
        world_size: int,
        controller: PartData | None = None,
        metadata: dict[str, Any] | None = None,
        workers: Mapping[int, storage_acks.Worker] | Sequence[storage_acks.Worker] | None = None,
        lock: LockLike | None = None,
        poll_interval: float = 0.02,
    ) -> Manifest:
        """Wait for all ``world_size`` parts to be acknowledged through storage, then commit them.

        The coordinator's side of a save whose ranks called :meth:`write_part` with
        ``record_ack=True``; built on :meth:`commit_version`. Every wait is bounded by the
        timeout:

        * a part writer that failed (its :meth:`write_part` raised) makes this raise at once,
          naming the part and the writer's error;
        * a writer process in ``workers`` (``{position: process}`` or a sequence by position)
          that exits without acknowledging makes this raise at once, naming the part and the exit
          status;
        * parts still missing when the timeout runs out are named in the error.
        """
        version = check_version_id(version_id)
        size = _check_world_size(world_size)
        by_position = storage_acks.workers_by_position(workers, size)

        def gather(deadline: Deadline) -> list[PartAck]:
            return storage_acks.await_acks(
                self._layout, version, size, by_position, deadline, poll_interval, NOTHING_COMMITTED
            )

        return self._commit(version, gather, controller=controller, metadata=metadata, lock=lock)

    def _commit(
        self,
        version: str,
        gather: Callable[[Deadline], Sequence[PartAck]],
        *,
        controller: PartData | None,
        metadata: dict[str, Any] | None,
        lock: LockLike | None,
    ) -> Manifest:
        layout = self._layout
        user_metadata = checked_metadata(metadata)
        deadline = self._deadline()
        # Misuse fails here, before the ranks' parts would be discarded with the version.
        if controller is not None and not isinstance(controller, bytes | bytearray | memoryview | Path):
            kind_of(controller, label_of(None))
        refuse_committed(layout, version)

        def store() -> Stored:
            record: PartRecord | None = None
            if controller is not None:
                with locked_scratch_directory("flyte-cp-state-") as scratch:
                    try:
                        payload = payload_of(
                            controller,
                            self._serializer,
                            Path(scratch) / CONTROLLER_NAME,
                            lock=lock,
                            deadline=deadline,
                            position=None,
                            consequence=NOTHING_COMMITTED,
                        )
                    except CheckpointError:
                        raise
                    except Exception as exc:
                        raise part_failed(
                            None, f"capturing its state raised {describe_exception(exc)}", NOTHING_COMMITTED
                        ) from exc
                    record = store_controller(layout, version, payload)
            return record, gather(deadline)

        return commit_parts(
            layout, version, store, metadata=user_metadata, deadline=deadline, max_workers=self._max_workers
        )

    def read_part(
        self, position: int | None = None, *, version_id: str | None = None, world_size: int | None = None
    ) -> bytes:
        """The bytes of one part of the committed checkpoint, checked against the manifest's digest.

        ``position=None`` reads this process's rank, and then the checkpoint's part count must
        equal ``WORLD_SIZE`` (or ``world_size`` when given). ``version_id`` (e.g. from the
        coordinator's :meth:`verify`) pins the version every rank reads; it must still be the
        committed one.
        """
        layout = self._layout
        index, size = resolve_position(position, world_size)
        deadline = self._deadline()

        def read(manifest: Manifest) -> bytes:
            check_rank_count(layout, manifest, index, size)
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

    def load_part(
        self,
        position: int | None,
        component: Component,
        *,
        version_id: str | None = None,
        world_size: int | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Restore ``component`` from one part of the committed checkpoint; returns the manifest.

        The part is fetched, verified and decoded before the component is touched; if applying
        it fails, the component is rolled back. Positions and ``version_id`` work as in
        :meth:`read_part`.
        """
        layout = self._layout
        index, size = resolve_position(position, world_size)
        target = Target(index, component, kind_of(component, label_of(index)))

        def check(manifest: Manifest) -> None:
            check_rank_count(layout, manifest, index, size)

        return self._load([target], version_id=version_id, check=check, lock=lock)

    def load_controller(
        self,
        controller: Component,
        *,
        version_id: str | None = None,
        world_size: int | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Restore the coordinator's ``controller`` alone (its ranks restore their own parts).

        ``world_size``, when given, must equal the checkpoint's part count.
        """
        layout = self._layout
        target = Target(None, controller, kind_of(controller, label_of(None)))

        def check(manifest: Manifest) -> None:
            check_counts(
                layout,
                manifest,
                parts=manifest.world_size if world_size is None else world_size,
                controller=True,
            )

        return self._load([target], version_id=version_id, check=check, lock=lock)

    def _load(
        self,
        targets: Sequence[Target],
        *,
        version_id: str | None,
        check: Callable[[Manifest], None],
        lock: LockLike | None,
        progress: ProgressCallback | None = None,
    ) -> Manifest:
        started = time.monotonic()
        manifest = load_into(
            self._layout,
            targets,
            version_id=version_id,
            check=check,
            serializer=self._serializer,
            lock=lock,
            deadline=self._deadline(),
            max_workers=self._max_workers,
            progress=progress,
        )
        _log_checkpoint("loaded", self._layout.root, manifest, started)
        return manifest


def _log_checkpoint(verb: str, root: str, manifest: Manifest, started: float) -> None:
    """The INFO line a :class:`~flyte_checkpoint.Checkpoint` logs, for a multi-part checkpoint."""
    records = [*manifest.parts, *([manifest.controller] if manifest.controller else [])]
    what = f"state version {manifest.version_id} ({len(manifest.parts)} parts"
    what += " and a controller)" if manifest.controller else ")"
    log_transfer(verb, root, what, sum(record.size for record in records), started)


def _rebuild(
    root: str,
    storage_options: StorageOptions | None,
    serializer: Serializer,
    timeout: float,
    max_workers: int | None,
    transfer: TransferSettings | None = None,
) -> StateCheckpoint:
    return StateCheckpoint(
        root,
        storage_options=storage_options,
        transfer=transfer,
        serializer=serializer,
        timeout=timeout,
        max_workers=max_workers,
    )


def _holds_actors(controller: object, parts: object) -> bool:
    """Whether a component is a Ray actor handle. Ray is never imported here: a caller holding a
    handle has imported it already."""
    ray = sys.modules.get("ray")
    if ray is None or isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
        return False
    return any(isinstance(component, ray.actor.ActorHandle) for component in (controller, *parts))


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


def _capture(target: Target, serializer: Serializer, scratch: Path) -> Payload:
    name = CONTROLLER_NAME if target.position is None else part_name(target.position)
    try:
        return capture(target.component, target.kind, serializer, scratch / name)
    except Exception as exc:
        raise part_failed(
            target.position, f"capturing its state raised {describe_exception(exc)}", NOTHING_SAVED
        ) from exc


def _store_job(
    layout: Layout, version: str, position: int | None, payload: Payload, progress: CombinedProgress | None
) -> Callable[[], PartRecord]:
    if position is None:
        return lambda: store_controller(layout, version, payload, progress)
    return lambda: store_part(layout, version, position, payload, progress)


def _payload_size(payload: Payload) -> int:
    return payload.data.stat().st_size if isinstance(payload.data, Path) else len(payload.data)


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


def _check_world_size(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 0:
        raise InvalidCheckpointInputError(f"world_size must be a non-negative int, not {world_size!r}")
    return world_size
