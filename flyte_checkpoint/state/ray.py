"""Components as Ray actors: each actor writes and reads its own part; the driver only coordinates.

Any actor whose class follows :class:`~flyte_checkpoint.state.Stateful`
(``state_dict``/``load_state_dict``) or :class:`~flyte_checkpoint.state.FileComponent` is a
component: no mixin is needed. :meth:`StateCheckpoint.save` and :meth:`StateCheckpoint.load` (so
also ``save_checkpoint``, ``load_checkpoint`` and :class:`CheckpointManager`) hand actor handles
to :func:`save_actors` and :func:`load_actors`::

    @ray.remote
    class StorageUnit:
        def state_dict(self): ...
        def load_state_dict(self, state): ...

    units = [StorageUnit.remote() for _ in range(3)]
    checkpoint = StateCheckpoint("s3://bucket/run/ckpt", timeout=300)
    checkpoint.save(controller=controller, parts=units, metadata={"step": 7}, lock=lock)
    checkpoint.load(controller=controller, parts=units)

The driver runs small functions of this module inside each actor (Ray's ``__ray_call__``): the
actor captures, stores, stages and applies its own part, so the payload never passes through the
driver or Ray's object store; only acknowledgements (:class:`PartAck`) come back. Ray's own failure
detection bounds every wait: a dead actor, a lost node, an error inside an actor or a part that
misses the deadline raises this package's typed errors at once, naming the part.

This module imports ``ray``; the rest of the package never does (install the ``ray`` extra).
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayError, RayTaskError

from flyte_checkpoint.errors import CheckpointError, UnsupportedTypeError, add_context
from flyte_checkpoint.lockfiles import make_locked_directory, release_locked_directory
from flyte_checkpoint.state.commit import NOTHING_COMMITTED, Stored, commit_parts, store_controller
from flyte_checkpoint.state.components import (
    ComponentKind,
    Payload,
    Serializer,
    capture,
    describe_exception,
    kind_of,
    restore,
)
from flyte_checkpoint.state.failures import in_context, label_of, part_failed, timed_out
from flyte_checkpoint.state.layout import CONTROLLER_NAME, Layout, new_version_id, part_name
from flyte_checkpoint.state.manifest import Manifest, PartAck, PartRecord, checked_metadata
from flyte_checkpoint.state.parts import store_part
from flyte_checkpoint.state.pointer import with_committed
from flyte_checkpoint.state.restore import NOTHING_RESTORED, Staged, Target, check_counts, stage
from flyte_checkpoint.state.waiting import LockLike, held
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.timebounds import Deadline

logger = logging.getLogger("flyte_checkpoint")


class ActorCheckpoint(Protocol):
    """What saving and loading actors reads of the multi-part checkpoint they serve (a
    :class:`~flyte_checkpoint.state.StateCheckpoint`): its settings, and its verification."""

    @property
    def root(self) -> str: ...

    @property
    def storage_options(self) -> Mapping[str, Any] | None: ...

    @property
    def transfer(self) -> TransferSettings | None: ...

    @property
    def serializer(self) -> Serializer: ...

    @property
    def timeout(self) -> float: ...

    @property
    def max_workers(self) -> int | None: ...

    def verify(self, *, world_size: int | None = None, read_parts: bool = True) -> Manifest: ...


NOTHING_SAVED = "nothing was saved; the previous checkpoint is unchanged"
_CLEANUP_SECONDS = 5.0
"""How long a failed operation waits, at least, for its actors to drop what they hold."""


@dataclass(frozen=True)
class _Member:
    """A component taking part in one operation: an actor, or a local object run in the driver."""

    position: int | None
    component: object

    @property
    def actor(self) -> ActorHandle[Any] | None:
        return self.component if isinstance(self.component, ActorHandle) else None


def _members(controller: object | None, parts: Sequence[object]) -> list[_Member]:
    if isinstance(parts, str | bytes) or not isinstance(parts, Sequence):
        raise UnsupportedTypeError(
            f"parts must be a sequence of components or actor handles, not {type(parts).__name__}"
        )
    members = [_Member(None, controller)] if controller is not None else []
    members += [_Member(index, part) for index, part in enumerate(parts)]
    for member in members:
        if member.actor is None:
            kind_of(member.component, label_of(member.position))  # misuse fails before any call
    return members


# --------------------------------------------------------------------------- the coordinator


def save_actors(
    checkpoint: ActorCheckpoint,
    *,
    controller: object | None,
    parts: Sequence[object],
    metadata: dict[str, Any] | None = None,
    lock: LockLike | None = None,
) -> Manifest:
    """Save the components (actor handles or local objects) as one checkpoint; see
    :meth:`StateCheckpoint.save`.

    Every component captures its state while the driver holds ``lock`` (a mutation that takes
    the same lock, and waits for its actor calls inside it, is never half in a checkpoint); then
    each writes its own part straight to the checkpoint location, and the driver commits the
    acknowledgements. A failure anywhere raises with nothing committed.
    """
    members = _members(controller, parts)
    user_metadata = checked_metadata(metadata)
    layout = Layout.of(checkpoint.root, checkpoint.storage_options, checkpoint.transfer)
    deadline = Deadline.after(checkpoint.timeout)
    version = new_version_id()
    token = uuid.uuid4().hex

    def store() -> Stored:
        try:
            with held(lock, deadline, NOTHING_SAVED):
                _gather(
                    _submit(members, _capture_part, checkpoint, token),
                    deadline,
                    f"capturing the state of {layout.root}",
                    NOTHING_SAVED,
                )
            stored = _gather(
                _submit(members, _store_part, checkpoint, token, version),
                deadline,
                f"saving {layout.root}",
                NOTHING_SAVED,
            )
        except BaseException:
            _finish(members, checkpoint, token)
            raise
        record = stored.pop(None, None)
        if record is not None:
            _check_stored(layout, version, record)
        return record, [ack for ack in stored.values() if isinstance(ack, PartAck)]

    return commit_parts(
        layout,
        version,
        store,
        metadata=user_metadata,
        deadline=deadline,
        max_workers=checkpoint.max_workers,
    )


def load_actors(
    checkpoint: ActorCheckpoint,
    *,
    controller: object | None,
    parts: Sequence[object],
    lock: LockLike | None = None,
) -> Manifest:
    """Restore the components (actor handles or local objects) by position; see
    :meth:`StateCheckpoint.load`.

    The driver verifies the checkpoint first (it exists and is committed, the part count equals
    ``len(parts)``, every part is present with its recorded size), reading no payload. Then every
    actor fetches, verifies and decodes its own part, and only when all have done so does each
    apply it (under ``lock``), keeping its prior state until all succeeded: if any fails or its
    actor dies, every other component is rolled back to what it held before.
    """
    members = _members(controller, parts)
    layout = Layout.of(checkpoint.root, checkpoint.storage_options, checkpoint.transfer)
    manifest = checkpoint.verify(world_size=len(parts), read_parts=False)
    check_counts(layout, manifest, parts=len(parts), controller=controller is not None)
    deadline = Deadline.after(checkpoint.timeout)
    token = uuid.uuid4().hex
    try:
        _gather(
            _submit(members, _stage_part, checkpoint, token, manifest.version_id),
            deadline,
            f"loading {layout.root}",
            NOTHING_RESTORED,
        )
        with held(lock, deadline, NOTHING_RESTORED):
            applying = _submit(members, _apply_part, checkpoint, token)
            try:
                _gather(applying, deadline, f"applying {layout.root}", NOTHING_RESTORED)
            except CheckpointError as exc:
                _roll_back(members, checkpoint, token, deadline, exc)
                raise
    finally:
        _finish(members, checkpoint, token)
    return manifest


def _roll_back(
    members: Sequence[_Member], checkpoint: ActorCheckpoint, token: str, deadline: Deadline, exc: Exception
) -> None:
    """Return every component that applied its part to its prior state; say so on ``exc``."""
    failed = getattr(exc, "position", None)
    # Rolling back must be attempted even when the deadline has passed.
    bound = Deadline.after(max(deadline.remaining(), _CLEANUP_SECONDS))
    outcomes = _settle(_submit(members, _roll_back_part, checkpoint, token), bound)
    problems = [
        f"{label_of(position)}: {describe_exception(error)}"
        for position, error in outcomes.items()
        if error is not None and position != failed
    ]
    if problems:
        add_context(
            exc,
            f"rolling back also failed ({'; '.join(problems)}), so the components may now hold a "
            "mix of states",
        )
    else:
        add_context(exc, "every other component was rolled back to its state before the load")


def _finish(members: Sequence[_Member], checkpoint: ActorCheckpoint, token: str) -> None:
    """Let every component drop what it holds for this operation (best-effort, briefly bounded)."""
    _settle(_submit(members, _release_part, checkpoint, token), Deadline.after(_CLEANUP_SECONDS))


def _check_stored(layout: Layout, version: str, record: PartRecord) -> None:
    # An actor on another node may write to its own disk: a local path must be shared by all.
    info = layout.backend.info(layout.object_uri(version, record.name))
    if info is None or info.size != record.size:
        raise part_failed(
            None,
            f"its actor stored {record.name}, but the driver does not find it with its size (a local "
            "path must be on a filesystem every node shares; or use an object store URI)",
            NOTHING_COMMITTED,
        )


# --------------------------------------------------------------------------- running on actors

_Call = Callable[..., Any]
_Outcome = tuple[Any, BaseException | None]


@dataclass
class _Calls:
    """One function submitted to every member: Ray refs for actors, outcomes of local members."""

    refs: dict[ray.ObjectRef[Any], int | None]
    local: dict[int | None, _Outcome]


def _submit(members: Sequence[_Member], function: _Call, *args: Any) -> _Calls:
    """Run ``function(component, position, *args)`` in every actor (concurrently), then locally."""
    refs = {
        member.actor.__ray_call__.remote(function, member.position, *args): member.position
        for member in members
        if member.actor is not None
    }
    local: dict[int | None, _Outcome] = {}
    for member in members:
        if member.actor is None:
            try:
                local[member.position] = (function(member.component, member.position, *args), None)
            except Exception as exc:
                local[member.position] = (None, exc)
    return _Calls(refs, local)


def _gather(calls: _Calls, deadline: Deadline, what: str, consequence: str) -> dict[int | None, Any]:
    """Every member's result, or the first failure as this package's error, raised as it arrives."""
    results: dict[int | None, Any] = {}
    for position, (result, error) in calls.local.items():
        if error is not None:
            contextual = in_context(error, position, consequence)
            if contextual is error:
                raise error
            raise contextual from error
        results[position] = result
    pending = list(calls.refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=deadline.remaining())
        if not ready:
            missing = ", ".join(label_of(calls.refs[ref]) for ref in pending)
            raise timed_out(
                f"{what} did not finish within {deadline.seconds:g} s ({missing} not done); {consequence}"
            )
        for ref in ready:
            position = calls.refs[ref]
            try:
                results[position] = ray.get(ref)
            except RayError as exc:
                raise _from_ray(exc, position, consequence) from exc
    return results


def _settle(calls: _Calls, deadline: Deadline) -> dict[int | None, BaseException | None]:
    """Wait (bounded) for every member's call; each one's error or ``None``, never raising."""
    outcomes: dict[int | None, BaseException | None] = {
        position: error for position, (_, error) in calls.local.items()
    }
    if not calls.refs:
        return outcomes
    ready, pending = ray.wait(list(calls.refs), num_returns=len(calls.refs), timeout=deadline.remaining())
    for ref in ready:
        try:
            ray.get(ref)
            outcomes[calls.refs[ref]] = None
        except RayError as exc:
            outcomes[calls.refs[ref]] = exc.cause if isinstance(exc, RayTaskError) else exc
    for ref in pending:
        outcomes[calls.refs[ref]] = TimeoutError("no answer in time")
    return outcomes


def _from_ray(exc: RayError, position: int | None, consequence: str) -> BaseException:
    """A Ray failure of one member's call as this package's error, naming the part."""
    if isinstance(exc, RayTaskError):
        cause = exc.cause
        if isinstance(cause, BaseException):
            return in_context(cause, position, consequence)
        return part_failed(position, f"its actor raised {_summary(exc)}", consequence)
    if isinstance(exc, ActorDiedError):
        return part_failed(position, f"its actor died ({_summary(exc)})", consequence)
    if isinstance(exc, ActorUnavailableError):
        return part_failed(
            position, f"its actor is unreachable, its node may be lost ({_summary(exc)})", consequence
        )
    return part_failed(position, f"Ray reported {type(exc).__name__} ({_summary(exc)})", consequence)


def _summary(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


# --------------------------------------------------------------------------- inside each actor


@dataclass
class _Held:
    """What one component keeps between the calls of one operation, in its own process."""

    scratch: Path
    lock_fd: int
    kind: ComponentKind
    expires: float
    payload: Payload | None = None
    staged: Staged | None = None
    prior: Payload | None = None
    closed: bool = False

    def close(self) -> None:
        if not self.closed:  # the descriptor's number may be reused once it is closed
            self.closed = True
            release_locked_directory(str(self.scratch), self.lock_fd)


_SCRATCH_PREFIX = "flyte-cp-ray-"
_held: dict[tuple[str, int | None], _Held] = {}
_held_lock = threading.Lock()


def _hold(token: str, position: int | None, component: object, checkpoint: ActorCheckpoint) -> _Held:
    """A fresh entry for this operation; entries of operations whose driver vanished expire."""
    kind = kind_of(component, label_of(position))
    now = time.monotonic()
    scratch = make_locked_directory(Path(tempfile.gettempdir()), _SCRATCH_PREFIX)
    entry = _Held(*scratch, kind, now + checkpoint.timeout)
    with _held_lock:
        expired = [key for key, value in _held.items() if value.expires < now]
        stale = [_held.pop(key) for key in expired]
        previous = _held.pop((token, position), None)
        _held[(token, position)] = entry
    for value in [*stale, *([previous] if previous else [])]:
        value.close()
    return entry


def _entry(token: str, position: int | None) -> _Held:
    with _held_lock:
        entry = _held.get((token, position))
    if entry is None:
        raise CheckpointError(
            f"{label_of(position)} holds nothing for this operation (was its actor restarted?)"
        )
    return entry


def _capture_part(component: object, position: int | None, checkpoint: ActorCheckpoint, token: str) -> None:
    entry = _hold(token, position, component, checkpoint)
    name = CONTROLLER_NAME if position is None else part_name(position)
    try:
        entry.payload = capture(component, entry.kind, checkpoint.serializer, entry.scratch / name)
    except Exception as exc:
        raise part_failed(
            position, f"capturing its state raised {describe_exception(exc)}", NOTHING_SAVED
        ) from exc


def _store_part(
    component: object, position: int | None, checkpoint: ActorCheckpoint, token: str, version: str
) -> PartRecord:
    entry = _entry(token, position)
    assert entry.payload is not None
    layout = Layout.of(checkpoint.root, checkpoint.storage_options, checkpoint.transfer)
    try:
        if position is None:
            return store_controller(layout, version, entry.payload)
        return store_part(layout, version, position, entry.payload)
    finally:
        _release_part(component, position, checkpoint, token)


def _stage_part(
    component: object, position: int | None, checkpoint: ActorCheckpoint, token: str, version: str
) -> None:
    entry = _hold(token, position, component, checkpoint)
    layout = Layout.of(checkpoint.root, checkpoint.storage_options, checkpoint.transfer)
    target = Target(position, component, entry.kind)

    def fetch(manifest: Manifest) -> Staged:
        return stage(
            layout,
            manifest,
            [target],
            serializer=checkpoint.serializer,
            scratch=entry.scratch,
            deadline=Deadline.after(checkpoint.timeout),
            max_workers=1,
        )[0]

    entry.staged = with_committed(layout, version, fetch)[1]


def _apply_part(component: object, position: int | None, checkpoint: ActorCheckpoint, token: str) -> None:
    entry = _entry(token, position)
    staged = entry.staged
    assert staged is not None
    kind = staged.target.kind
    try:
        prior = capture(component, kind, checkpoint.serializer, entry.scratch / "prior")
    except Exception as exc:
        raise part_failed(
            position,
            f"capturing its current state (to roll back to) raised {describe_exception(exc)}",
            NOTHING_RESTORED,
        ) from exc
    try:
        restore(component, kind, staged.value)
    except Exception as exc:
        # The component may be half-applied: roll it back here; the driver rolls back the others.
        try:
            _restore_prior(component, kind, prior, checkpoint)
        except Exception as again:
            raise part_failed(
                position,
                f"applying its state raised {describe_exception(exc)}, and rolling it back raised "
                f"{describe_exception(again)}",
                "it may hold a mix of states",
            ) from exc
        raise part_failed(
            position,
            f"applying its state raised {describe_exception(exc)}",
            "it was rolled back to its state before the load",
        ) from exc
    entry.prior = prior


def _roll_back_part(component: object, position: int | None, checkpoint: ActorCheckpoint, token: str) -> None:
    with _held_lock:
        entry = _held.get((token, position))
    if entry is None or entry.prior is None or entry.staged is None:
        return  # never applied, or already rolled back by its own failure
    _restore_prior(component, entry.staged.target.kind, entry.prior, checkpoint)
    entry.prior = None


def _restore_prior(
    component: object, kind: ComponentKind, prior: Payload, checkpoint: ActorCheckpoint
) -> None:
    value = prior.data if kind == "file" else checkpoint.serializer.loads(_as_bytes(prior.data))
    restore(component, kind, value)


def _as_bytes(data: bytes | Path) -> bytes:
    return data if isinstance(data, bytes) else data.read_bytes()


def _release_part(component: object, position: int | None, checkpoint: ActorCheckpoint, token: str) -> None:
    with _held_lock:
        entry = _held.pop((token, position), None)
    if entry is not None:
        entry.close()
