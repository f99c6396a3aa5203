"""The commit protocol: part writers acknowledge, the coordinator waits (bounded) and commits.

How a commit is atomic, on every backend: all objects of a save go under a fresh
``versions/<version_id>/`` prefix that no reader looks at; once every part is acknowledged the
coordinator writes ``metadata.json`` and ``manifest.json`` there, and then replaces the one small
pointer object ``COMMITTED.json`` (naming the version and the manifest's sha256) through a single
atomic object write: a same-directory rename after fsync on local disk, a single PUT on object
stores. Before that write the old checkpoint is the committed one; after it, the new one. A crash
at any point leaves exactly one of them committed and complete. Versions the pointer does not name
are then deleted (garbage collection, best-effort: a crash during it only leaves garbage that the
next commit removes).

Single writer: one coordinator at a time saves to a checkpoint directory. Readers may run during
a save: a reader whose version is collected under its feet re-reads the pointer and retries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeAlias

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointUnavailableError,
    InvalidCheckpointInputError,
    UnsupportedTypeError,
)
from flyte_checkpoint.state.components import (
    PICKLE,
    Component,
    Payload,
    Serializer,
    capture,
    describe_exception,
    kind_of,
)
from flyte_checkpoint.state.failures import part_failed, timed_out
from flyte_checkpoint.state.layout import (
    CONTROLLER_NAME,
    MANIFEST_NAME,
    METADATA_NAME,
    Layout,
    ack_name,
    check_version_id,
    new_version_id,
    part_name,
)
from flyte_checkpoint.state.manifest import (
    AckRecord,
    CommitPointer,
    Flags,
    Manifest,
    PartAck,
    PartRecord,
    checked_metadata,
    from_json,
    sha256_hex,
    to_json,
)
from flyte_checkpoint.state.objects import read_record, write_object, write_record
from flyte_checkpoint.state.runtime import (
    DEFAULT_TIMEOUT,
    Deadline,
    LockLike,
    check_timeout,
    held,
)
from flyte_checkpoint.storage import StorageOptions

logger = logging.getLogger("flyte_checkpoint")

Worker: TypeAlias = BaseProcess | subprocess.Popen[Any] | int
"""A process writing a part: a ``multiprocessing.Process``, a ``subprocess.Popen``, or a pid."""

_MAX_POLL_INTERVAL = 0.1
_ACK_NAME = re.compile(r"^part-(\d+)\.json$")
_STABLE_READ_ATTEMPTS = 3


# --------------------------------------------------------------------------- reading what is committed


def read_pointer(layout: Layout) -> CommitPointer | None:
    """The commit pointer, or ``None`` when nothing was ever committed here."""
    data = read_record(layout.backend, layout.pointer_uri)
    return None if data is None else from_json(CommitPointer, data, layout.pointer_uri)


def read_committed(layout: Layout) -> Manifest:
    """The committed manifest, checked against the pointer's digest.

    Raises :class:`CheckpointNotFoundError` when nothing is committed (saying so when an
    uncommitted save left files) and :class:`CheckpointCorruptError` when the pointer or the
    manifest is damaged.
    """
    for _ in range(_STABLE_READ_ATTEMPTS):
        pointer = read_pointer(layout)
        if pointer is None:
            if layout.list_versions():
                raise CheckpointNotFoundError(
                    f"no committed checkpoint at {layout.root}: it holds the files of a save that "
                    "was interrupted or is still running, but none was ever committed"
                )
            raise CheckpointNotFoundError(f"no checkpoint at {layout.root}")
        uri = layout.object_uri(pointer.version_id, MANIFEST_NAME)
        data = read_record(layout.backend, uri)
        if data is None:
            if pointer_moved(layout, pointer.version_id):
                continue
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: its committed manifest {uri} is missing"
            )
        if len(data) != pointer.manifest_size or sha256_hex(data) != pointer.manifest_sha256:
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: the sha256 of {uri} does not match the "
                "one the commit pointer recorded"
            )
        manifest = from_json(Manifest, data, uri)
        if manifest.version_id != pointer.version_id:
            raise CheckpointCorruptError(
                f"checkpoint {layout.root} is damaged: {uri} describes version "
                f"{manifest.version_id}, not {pointer.version_id}"
            )
        return manifest
    raise CheckpointError(f"checkpoint {layout.root} kept changing while it was being read; retry")


def pointer_moved(layout: Layout, version_id: str) -> bool:
    """Whether a newer commit replaced ``version_id`` (so a failed read of it may be retried)."""
    with contextlib.suppress(CheckpointError):
        current = read_pointer(layout)
        return current is not None and current.version_id != version_id
    return False


# --------------------------------------------------------------------------- beginning a save


def begin(
    checkpoint_dir: str | os.PathLike[str],
    *,
    version_id: str | None = None,
    storage_options: StorageOptions | None = None,
) -> str:
    """Start a save: return the version id every part writer of this save must be given.

    The id names a fresh, invisible directory for this save's objects. Pass it to each rank's
    :func:`~flyte_checkpoint.state.write_part` and to :func:`commit`. A caller-chosen
    ``version_id`` (e.g. ``f"step{step}-attempt{attempt}"``, so ranks know it without being
    told) must be new for every save attempt: acknowledgements left under a reused id by an
    earlier, failed attempt would be taken for this attempt's.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    if version_id is None:
        return new_version_id()
    chosen = check_version_id(version_id)
    _refuse_committed(layout, chosen)
    return chosen


def _refuse_committed(layout: Layout, version_id: str) -> None:
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


# --------------------------------------------------------------------------- committing


def commit(
    checkpoint_dir: str | os.PathLike[str],
    version_id: str,
    *,
    world_size: int,
    controller: Component | None = None,
    metadata: dict[str, Any] | None = None,
    workers: Mapping[int, Worker] | Sequence[Worker] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    lock: LockLike | None = None,
    serializer: Serializer = PICKLE,
    storage_options: StorageOptions | None = None,
    poll_interval: float = 0.02,
) -> Manifest:
    """Wait for all ``world_size`` parts of ``version_id`` to be acknowledged, then commit them.

    The coordinator's side of a multi-process save. ``controller`` (a component, optional) is
    captured under ``lock`` and stored by this process. Every wait is bounded by ``timeout``:

    * a part writer that failed (its :func:`write_part` raised) makes this raise at once, naming
      the part and the writer's error;
    * a writer process in ``workers`` (``{position: process}`` or a sequence by position) that
      exits without acknowledging makes this raise at once, naming the part and the exit status;
    * parts still missing when ``timeout`` runs out are named in the error.

    On any failure nothing is committed, the previous checkpoint stays the loadable one, and this
    version's objects are removed (best-effort). Returns the committed :class:`Manifest`.
    """
    layout = Layout.of(checkpoint_dir, storage_options)
    version = check_version_id(version_id)
    size = _check_world_size(world_size)
    user_metadata = checked_metadata(metadata)
    by_position = _workers_by_position(workers, size)
    deadline = Deadline(check_timeout(timeout))
    kind = kind_of(controller, "the controller") if controller is not None else None
    # Re-committing the committed version would rewrite its manifest under a live pointer.
    _refuse_committed(layout, version)
    consequence = "nothing was committed; the previous checkpoint is unchanged"
    try:
        controller_record = None
        if controller is not None and kind is not None:
            with tempfile.TemporaryDirectory(prefix="flyte-cp-state-") as staging:
                with held(lock, deadline, consequence):
                    try:
                        payload = capture(controller, kind, serializer, Path(staging) / CONTROLLER_NAME)
                    except Exception as exc:
                        raise part_failed(
                            None, f"capturing its state raised {describe_exception(exc)}", consequence
                        ) from exc
                controller_record = store_controller(layout, version, payload)
        acks = await_acks(layout, version, size, by_position, deadline, poll_interval, consequence)
        manifest, manifest_bytes = write_manifest(
            layout, version, controller=controller_record, parts=acks, metadata=user_metadata
        )
    except BaseException:
        discard_version(layout, version)
        raise
    publish(layout, version, manifest_bytes)
    return manifest


def store_controller(layout: Layout, version_id: str, payload: Payload) -> PartRecord:
    written = write_object(layout.backend, layout.object_uri(version_id, CONTROLLER_NAME), payload)
    return PartRecord(
        name=CONTROLLER_NAME,
        part_id=os.urandom(8).hex(),
        size=written.size,
        digest=written.digest,
        encoding=payload.encoding,
    )


def _check_world_size(world_size: object) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 0:
        raise InvalidCheckpointInputError(f"world_size must be a non-negative int, not {world_size!r}")
    return world_size


def _workers_by_position(
    workers: Mapping[int, Worker] | Sequence[Worker] | None, world_size: int
) -> dict[int, Worker]:
    if workers is None:
        return {}
    if isinstance(workers, Mapping):
        by_position = dict(workers)
    elif isinstance(workers, Sequence) and not isinstance(workers, str | bytes):
        if len(workers) != world_size:
            raise InvalidCheckpointInputError(
                f"workers lists {len(workers)} processes for {world_size} parts; give one per "
                "position, or a {position: process} mapping"
            )
        by_position = dict(enumerate(workers))
    else:
        raise UnsupportedTypeError(f"workers must be a mapping or a sequence, not {type(workers).__name__}")
    for position, worker in by_position.items():
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < world_size:
            raise InvalidCheckpointInputError(
                f"workers names position {position!r}, outside 0..{world_size - 1}"
            )
        if not isinstance(worker, BaseProcess | subprocess.Popen) and (
            isinstance(worker, bool) or not isinstance(worker, int)
        ):
            raise UnsupportedTypeError(
                f"the worker of part {position} is a {type(worker).__name__}; give a "
                "multiprocessing.Process, a subprocess.Popen or a pid"
            )
    return by_position


def exit_status(worker: Worker) -> str | None:
    """How ``worker`` ended ("... exited with code 1", "... killed by SIGKILL"); ``None`` while it runs."""
    if isinstance(worker, BaseProcess):
        code = worker.exitcode
        pid = worker.pid
    elif isinstance(worker, subprocess.Popen):
        code = worker.poll()
        pid = worker.pid
    else:
        pid = worker
        if _pid_alive(pid):
            return None
        return f"its writer process {pid} is gone"
    if code is None:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"its writer process {pid} was killed by {name}"
    return f"its writer process {pid} exited with code {code}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A dead child that nobody has reaped yet still answers signal 0; Linux shows it as a zombie.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[0] != b"Z"
    except (OSError, IndexError):
        return True


def await_acks(
    layout: Layout,
    version_id: str,
    world_size: int,
    workers: Mapping[int, Worker],
    deadline: Deadline,
    poll_interval: float,
    consequence: str,
) -> list[PartAck]:
    """Poll the version's ``acks/`` until every position has acknowledged; bounded by ``deadline``.

    One listing per round finds new acknowledgements, so the cost of a round does not grow with
    the number of parts still missing. A worker's exit is checked *before* the listing, so an
    acknowledgement written just before it exited is never mistaken for a missing one.
    """
    acks: dict[int, PartAck] = {}
    expected = {ack_name(position): position for position in range(world_size)}
    interval = max(0.001, poll_interval)
    acks_uri = layout.acks_uri(version_id)
    while len(acks) < world_size:
        exited = {
            position: status
            for position, worker in workers.items()
            if position not in acks and (status := exit_status(worker)) is not None
        }
        try:
            listed = layout.backend.list_prefix(acks_uri)
        except CheckpointUnavailableError as exc:
            # A transient listing failure is not a verdict: keep polling until the deadline.
            logger.debug("listing %s failed (%s); polling again", acks_uri, exc)
            listed = []
        for uri in listed:
            name = uri.rsplit("/", 1)[-1]
            position = expected.get(name)
            if position is None:
                _refuse_stray_ack(name, world_size, consequence)
                continue
            if position not in acks:
                acks[position] = _accept_ack(layout, version_id, position, uri, consequence)
        for position, status in sorted(exited.items()):
            if position not in acks:
                raise part_failed(position, f"{status} before acknowledging its part", consequence)
        if len(acks) == world_size:
            break
        if deadline.expired:
            missing = [position for position in range(world_size) if position not in acks]
            raise timed_out(
                f"timed out after {deadline.timeout:g} s waiting for {_describe_positions(missing)} "
                f"of {world_size} under {layout.version_uri(version_id)}; {consequence}"
            )
        time.sleep(min(interval, deadline.remaining()))
        interval = min(interval * 1.5, _MAX_POLL_INTERVAL)
    return [acks[position] for position in range(world_size)]


def _refuse_stray_ack(name: str, world_size: int, consequence: str) -> None:
    """A writer that thinks the world is larger than the coordinator does is a misconfiguration
    that waiting cannot fix: say so at once."""
    match = _ACK_NAME.match(name)
    if match is not None and int(match.group(1)) >= world_size:
        raise part_failed(
            int(match.group(1)),
            f"a writer acknowledged it, but the coordinator expects only {world_size} parts "
            f"(positions 0..{world_size - 1}); check RANK and WORLD_SIZE",
            consequence,
        )


def _describe_positions(positions: list[int]) -> str:
    shown = ", ".join(str(position) for position in positions[:20])
    more = f" and {len(positions) - 20} more" if len(positions) > 20 else ""
    return f"part{'s' if len(positions) > 1 else ''} {shown}{more}"


def _accept_ack(layout: Layout, version_id: str, position: int, uri: str, consequence: str) -> PartAck:
    data = read_record(layout.backend, uri)
    if data is None:
        raise part_failed(position, f"its acknowledgement {uri} vanished", consequence)
    record = from_json(AckRecord, data, uri)
    if record.position != position:
        raise part_failed(position, f"{uri} acknowledges part {record.position} instead", consequence)
    if not record.ok:
        raise part_failed(
            position, f"its writer (pid {record.pid} on {record.host}) raised {record.error}", consequence
        )
    ack = record.part
    assert ack is not None
    if ack.name != part_name(position):
        raise part_failed(position, f"it was stored as {ack.name}, not {part_name(position)}", consequence)
    # No payload passes through here: the object's size (and digest, where the backend records
    # one) is checked against the acknowledgement from its metadata alone.
    info = layout.backend.info(layout.object_uri(version_id, ack.name))
    if info is None:
        raise part_failed(position, "it was acknowledged, but its object is missing", consequence)
    if info.size != ack.size or (info.recorded_digest is not None and info.recorded_digest != ack.digest):
        raise part_failed(
            position, "its stored object does not match its acknowledgement (size or digest)", consequence
        )
    return ack


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
    layout.sync_directories(version_id)
    return manifest, manifest_bytes


def publish(layout: Layout, version_id: str, manifest_bytes: bytes) -> None:
    """The commit point: atomically replace the pointer, then collect older versions.

    Called only when every object of the version is stored and durable. If the pointer write
    fails, the version is kept (the write may still have landed); the next commit collects it
    if it did not.
    """
    pointer = CommitPointer(
        version_id=version_id,
        manifest_sha256=sha256_hex(manifest_bytes),
        manifest_size=len(manifest_bytes),
        committed=datetime.now(timezone.utc),
    )
    # One atomic object write (rename on local disk, single PUT on object stores); writing the
    # same pointer twice is harmless, so a retried write after a lost reply is safe.
    write_record(layout.backend, layout.pointer_uri, to_json(pointer))
    collect_garbage(layout, keep=version_id)


def discard_version(layout: Layout, version_id: str) -> None:
    """Remove an uncommitted version's objects, best-effort (garbage collection retries later)."""
    try:
        pointer = read_pointer(layout)
        if pointer is not None and pointer.version_id == version_id:
            return
        layout.backend.delete_prefix(layout.version_uri(version_id))
    except CheckpointError as exc:
        logger.warning("could not remove the uncommitted version %s: %s", layout.version_uri(version_id), exc)


def collect_garbage(layout: Layout, *, keep: str) -> list[str]:
    """Delete every version except ``keep`` and the committed one; returns the deleted ids.

    Best-effort: a failure is logged, never raised, because the checkpoint is already committed.
    """
    deleted: list[str] = []
    try:
        pointer = read_pointer(layout)
        keep_ids = {keep} | ({pointer.version_id} if pointer is not None else set())
        for version in layout.list_versions():
            if version not in keep_ids:
                layout.backend.delete_prefix(layout.version_uri(version))
                deleted.append(version)
    except CheckpointError as exc:
        logger.warning(
            "could not remove old versions under %s (the next commit retries): %s", layout.versions_uri, exc
        )
    return deleted


def host_name() -> str:
    return socket.gethostname()
