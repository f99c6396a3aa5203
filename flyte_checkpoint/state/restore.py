"""Transactional restore: stage every part (fetch, verify, decode), then apply, rolling back on failure.

Nothing touches a component until every part it will receive has been read to its end, matched
the manifest's size and digest, and been decoded. Applying then captures each component's current
state first, so a failure while applying any part (the last one included) restores every
component, the failing one too, to exactly what it held before the load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    InvalidCheckpointInputError,
    UntrustedContentError,
    add_context,
)
from flyte_checkpoint.lockfiles import locked_scratch_directory
from flyte_checkpoint.progress import ProgressCallback, combined
from flyte_checkpoint.state.components import (
    BYTES_ENCODING,
    FILE_ENCODING,
    ComponentKind,
    Payload,
    Serializer,
    capture,
    describe_exception,
    restore,
)
from flyte_checkpoint.state.failures import label_of, part_failed
from flyte_checkpoint.state.layout import Layout
from flyte_checkpoint.state.manifest import Manifest, PartRecord
from flyte_checkpoint.state.objects import fetch_bytes, fetch_to_file
from flyte_checkpoint.state.pointer import with_committed
from flyte_checkpoint.state.waiting import LockLike, held, run_bounded
from flyte_checkpoint.timebounds import Deadline

logger = logging.getLogger("flyte_checkpoint")

NOTHING_RESTORED = "nothing was restored; every component is unchanged"


@dataclass(frozen=True)
class Target:
    """A component to restore, and the position of its part (``None`` for the controller)."""

    position: int | None
    component: object
    kind: ComponentKind


@dataclass(frozen=True)
class Staged:
    target: Target
    value: Any
    """The decoded state, or the path of the fetched file for a file component."""


def load_into(
    layout: Layout,
    targets: Sequence[Target],
    *,
    version_id: str | None,
    check: Callable[[Manifest], None],
    serializer: Serializer,
    lock: LockLike | None,
    deadline: Deadline,
    max_workers: int | None,
    progress: ProgressCallback | None = None,
) -> Manifest:
    """The one load: ``check`` the committed manifest, stage every target's part, apply them all.

    ``version_id`` pins the version (it must still be the committed one); otherwise a load that
    a concurrent commit overtook starts over on the new version. Returns the applied manifest.
    """
    with locked_scratch_directory("flyte-cp-state-") as scratch:

        def check_and_stage(manifest: Manifest) -> list[Staged]:
            check(manifest)
            return stage(
                layout,
                manifest,
                targets,
                serializer=serializer,
                scratch=Path(scratch),
                deadline=deadline,
                max_workers=max_workers,
                progress=progress,
            )

        manifest, staged = with_committed(layout, version_id, check_and_stage)
        apply_all(
            staged, serializer=serializer, lock=lock, deadline=deadline, scratch=Path(scratch) / "prior"
        )
    return manifest


def check_counts(layout: Layout, manifest: Manifest, *, parts: int, controller: bool | None) -> None:
    """The running system must offer exactly the parts (and the controller) the checkpoint holds."""
    if parts != manifest.world_size:
        raise InvalidCheckpointInputError(
            f"checkpoint {layout.root} has {manifest.world_size} parts, but the running system has "
            f"{parts}; parts are matched by position, so the counts must be equal"
        )
    if controller is None:
        return
    if manifest.controller is not None and not controller:
        raise InvalidCheckpointInputError(
            f"checkpoint {layout.root} holds a controller state; pass controller=... to restore it"
        )
    if manifest.controller is None and controller:
        raise InvalidCheckpointInputError(
            f"checkpoint {layout.root} holds no controller state, but a controller was given; "
            "pass controller=None"
        )


def record_of(manifest: Manifest, position: int | None) -> PartRecord:
    record = manifest.controller if position is None else manifest.parts[position]
    assert record is not None
    return record


def stage(
    layout: Layout,
    manifest: Manifest,
    targets: Sequence[Target],
    *,
    serializer: Serializer,
    scratch: Path,
    deadline: Deadline,
    max_workers: int | None,
    progress: ProgressCallback | None = None,
) -> list[Staged]:
    """Fetch, verify and decode the part of every target, concurrently and bounded by ``deadline``.

    ``progress(bytes_read, total)`` is told how far the parts got, all together."""
    for target in targets:
        record = record_of(manifest, target.position)
        if target.kind == "state" and record.encoding != serializer.name:
            hint = (
                "give a component with load_from_path(path), or read the bytes with read_part()"
                if record.encoding in (FILE_ENCODING, BYTES_ENCODING)
                else f"load it with a serializer named {record.encoding!r}"
            )
            raise InvalidCheckpointInputError(
                f"{label_of(target.position)} of {layout.root} was saved as {record.encoding!r}, but "
                f"the component's state is decoded with {serializer.name!r}: {hint}"
            )

    wanted = [record_of(manifest, target.position) for target in targets]
    told = combined(progress, sum(record.size for record in wanted))

    def job(target: Target) -> Staged:
        record = record_of(manifest, target.position)
        uri = layout.object_uri(manifest.version_id, record.name)
        label = label_of(target.position)
        if target.kind == "file":
            dest = scratch / record.name
            return Staged(target, fetch_to_file(layout.backend, uri, record, label, dest, told))
        data = fetch_bytes(layout.backend, uri, record, label, told)
        try:
            value = serializer.loads(data)
        except UntrustedContentError as exc:
            add_context(exc, f"refused {label}", uri=uri)
            raise
        except Exception as exc:
            raise CheckpointCorruptError(
                f"{label} could not be decoded with {serializer.name!r}: {describe_exception(exc)}"
            ) from exc
        return Staged(target, value)

    staged = run_bounded(
        [(target.position, partial(job, target)) for target in targets],
        deadline=deadline,
        max_workers=max_workers,
        what=f"loading {layout.root}",
        consequence=NOTHING_RESTORED,
    )
    if told is not None:
        told.finish()
    return staged


def apply_all(
    staged: Sequence[Staged],
    *,
    serializer: Serializer,
    lock: LockLike | None,
    deadline: Deadline,
    scratch: Path,
) -> None:
    """Apply every staged part, all or nothing, under the caller's lock or pause hook."""
    scratch.mkdir(parents=True, exist_ok=True)
    with held(lock, deadline, NOTHING_RESTORED):
        priors: list[Payload] = []
        for item in staged:
            target = item.target
            try:
                priors.append(
                    capture(target.component, target.kind, serializer, scratch / f"prior-{len(priors)}")
                )
            except Exception as exc:
                raise part_failed(
                    target.position,
                    f"capturing its current state (to roll back to) raised {describe_exception(exc)}",
                    NOTHING_RESTORED,
                ) from exc
        applied: list[tuple[Target, Payload]] = []
        for item, prior in zip(staged, priors, strict=True):
            try:
                restore(item.target.component, item.target.kind, item.value)
            except BaseException as exc:
                # The failing component may be half-applied: roll it back too, then the others.
                failures = _roll_back([*applied, (item.target, prior)], serializer)
                if not isinstance(exc, Exception):
                    raise
                cause = f"applying its state raised {describe_exception(exc)}"
                if failures:
                    raise part_failed(
                        item.target.position,
                        cause,
                        f"rolling back also failed ({'; '.join(failures)}), so the components may "
                        "now hold a mix of states",
                    ) from exc
                raise part_failed(
                    item.target.position,
                    cause,
                    "every component was rolled back to its state before the load",
                ) from exc
            applied.append((item.target, prior))


def _roll_back(applied: list[tuple[Target, Payload]], serializer: Serializer) -> list[str]:
    failures = []
    for target, prior in reversed(applied):
        try:
            value = prior.data if target.kind == "file" else serializer.loads(_as_bytes(prior.data))
            restore(target.component, target.kind, value)
        except Exception as exc:
            failures.append(f"{label_of(target.position)}: {describe_exception(exc)}")
            logger.error("rolling back %s failed: %s", label_of(target.position), exc)
    return failures


def _as_bytes(data: bytes | Path) -> bytes:
    return data if isinstance(data, bytes) else data.read_bytes()
