"""Numbered checkpoints under one root (``step_1000``, ``step_2000``, ...) with retention and fall-back."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.state.api import load_manifest_and_apply, save_checkpoint
from flyte_checkpoint.state.commit import Worker, begin, commit, read_committed
from flyte_checkpoint.state.components import PICKLE, Component, Serializer
from flyte_checkpoint.state.layout import POINTER_NAME, Layout
from flyte_checkpoint.state.manifest import Manifest
from flyte_checkpoint.state.runtime import DEFAULT_TIMEOUT, LockLike, check_timeout
from flyte_checkpoint.storage import StorageOptions
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.uris import local_path

logger = logging.getLogger("flyte_checkpoint")

STEP_DIR_PREFIX = "step_"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class StepSummary(BaseModel):
    """One step directory as ``flyte-checkpoint ls`` shows it."""

    model_config = ConfigDict(frozen=True)

    step: int
    committed: bool
    version_id: str | None = None
    created: datetime | None = None
    parts: int | None = None
    size: int | None = None
    """Bytes of all parts and the controller's state."""
    metadata: dict[str, Any] = {}


class RestoredStep(BaseModel):
    """What :meth:`CheckpointManager.load` restored."""

    model_config = ConfigDict(frozen=True)

    step: int
    version_id: str
    metadata: dict[str, Any]


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidCheckpointInputError(f"step must be a non-negative int, not {step!r}")
    return step


class CheckpointManager:
    """Multi-part checkpoints of numbered steps under ``root``, one directory per step.

    ``save(step, ...)`` writes ``root/step_<step>`` (see :func:`save_checkpoint`), then applies
    retention: with ``keep_last=K`` only the newest K committed steps are kept, and never the
    step this manager resumed from. ``load()`` restores the newest committed step; when that one
    fails verification (a part missing or damaged) it logs a warning with the reason and falls
    back to the next older committed step.

    Like every checkpoint directory, the root has one writer at a time.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        storage_options: StorageOptions | None = None,
        serializer: Serializer = PICKLE,
        timeout: float = DEFAULT_TIMEOUT,
        max_workers: int | None = None,
    ) -> None:
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise InvalidCheckpointInputError(f"keep_last must be a positive int or None, not {keep_last!r}")
        self._layout = Layout.of(root, storage_options)
        self._storage_options = storage_options
        self._keep_last = keep_last
        self._serializer = serializer
        self._timeout = check_timeout(timeout)
        self._max_workers = max_workers
        self._resumed_step: int | None = None

    @property
    def root(self) -> str:
        return self._layout.root

    @property
    def keep_last(self) -> int | None:
        return self._keep_last

    @property
    def resumed_step(self) -> int | None:
        """The step the last successful :meth:`load` restored; retention never deletes it."""
        return self._resumed_step

    def checkpoint_dir(self, step: int) -> str:
        """The checkpoint directory of ``step`` (give it to ranks writing parts of that step)."""
        return self._layout.join(f"{STEP_DIR_PREFIX}{_check_step(step)}")

    def steps(self) -> list[int]:
        """The committed steps, oldest first."""
        return sorted(self._scan()[0])

    def describe_steps(self) -> list[StepSummary]:
        """Every step directory, oldest first, committed or not, with what its manifest records."""
        committed, every = self._scan()
        summaries = []
        for step in sorted(every):
            if step not in committed:
                summaries.append(StepSummary(step=step, committed=False))
                continue
            manifest = read_committed(Layout.of(self.checkpoint_dir(step), self._storage_options))
            records = [*manifest.parts, *([manifest.controller] if manifest.controller else [])]
            summaries.append(
                StepSummary(
                    step=step,
                    committed=True,
                    version_id=manifest.version_id,
                    created=manifest.created,
                    parts=manifest.world_size,
                    size=sum(record.size for record in records),
                    metadata=manifest.metadata,
                )
            )
        return summaries

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None`` when there is none."""
        committed = self._scan()[0]
        return max(committed) if committed else None

    def save(
        self,
        step: int,
        *,
        controller: Component | None,
        parts: Sequence[Component],
        metadata: dict[str, Any] | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Save ``step`` (atomically replacing an earlier save of the same step), then apply retention."""
        manifest = save_checkpoint(
            self.checkpoint_dir(step),
            controller=controller,
            parts=parts,
            metadata=metadata,
            lock=lock,
            serializer=self._serializer,
            timeout=self._timeout,
            max_workers=self._max_workers,
            storage_options=self._storage_options,
        )
        self._retain_after(step)
        return manifest

    def begin(self, step: int, *, version_id: str | None = None) -> str:
        """Start a multi-process save of ``step``; see :func:`~flyte_checkpoint.state.begin`."""
        return begin(self.checkpoint_dir(step), version_id=version_id, storage_options=self._storage_options)

    def commit(
        self,
        step: int,
        version_id: str,
        *,
        world_size: int,
        controller: Component | None = None,
        metadata: dict[str, Any] | None = None,
        workers: Mapping[int, Worker] | Sequence[Worker] | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Commit a multi-process save of ``step``, then apply retention.

        See :func:`~flyte_checkpoint.state.commit`.
        """
        manifest = commit(
            self.checkpoint_dir(step),
            version_id,
            world_size=world_size,
            controller=controller,
            metadata=metadata,
            workers=workers,
            timeout=self._timeout,
            lock=lock,
            serializer=self._serializer,
            storage_options=self._storage_options,
        )
        self._retain_after(step)
        return manifest

    def load(
        self,
        step: int | None = None,
        *,
        controller: Component | None,
        parts: Sequence[Component],
        lock: LockLike | None = None,
    ) -> RestoredStep | None:
        """Restore ``step``, or the newest committed step that verifies; ``None`` when there is none.

        With ``step=None`` a step that fails verification (missing or damaged part, damaged
        manifest) is skipped with a warning naming the reason, and the next older committed step
        is tried; when none verifies, :class:`CheckpointCorruptError` lists every reason. Any
        other failure (a part-count mismatch, an unreachable store, a component that raises while
        applying, after which everything is rolled back) is raised as is. An explicit ``step`` is
        loaded or raises, with no fall-back.
        """
        if step is not None:
            return self._load_step(_check_step(step), controller, parts, lock)
        candidates = sorted(self._scan()[0], reverse=True)
        if not candidates:
            return None
        reasons: list[str] = []
        for index, candidate in enumerate(candidates):
            try:
                return self._load_step(candidate, controller, parts, lock)
            except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
                reasons.append(f"step {candidate}: {exc}")
                older = candidates[index + 1] if index + 1 < len(candidates) else None
                logger.warning(
                    "checkpoint step %d under %s failed verification, %s: %s",
                    candidate,
                    self.root,
                    f"falling back to step {older}" if older is not None else "and no older step is left",
                    exc,
                )
        raise CheckpointCorruptError(
            f"no committed step under {self.root} could be loaded: " + "; ".join(reasons)
        )

    def _load_step(
        self, step: int, controller: object | None, parts: Sequence[object], lock: LockLike | None
    ) -> RestoredStep:
        manifest = load_manifest_and_apply(
            self.checkpoint_dir(step),
            controller=controller,
            parts=parts,
            lock=lock,
            serializer=self._serializer,
            timeout=self._timeout,
            max_workers=self._max_workers,
            storage_options=self._storage_options,
        )
        self._resumed_step = step
        return RestoredStep(step=step, version_id=manifest.version_id, metadata=dict(manifest.metadata))

    def apply_retention(self) -> list[int]:
        """Delete what ``keep_last`` no longer keeps; returns the deleted steps.

        Kept: the newest ``keep_last`` committed steps and the step this manager resumed from.
        Also deleted: directories of saves that never committed, when a newer step is committed
        (they can never be loaded). A step is deleted pointer first, so a crash midway leaves an
        uncommitted directory, never a committed but incomplete checkpoint.
        """
        return self._apply_retention(protect=set())

    def _retain_after(self, step: int) -> None:
        try:
            self._apply_retention(protect={step})
        except CheckpointError as exc:
            # The save is committed; retention is housekeeping that the next save retries.
            logger.warning("retention under %s failed (the next save retries): %s", self.root, exc)

    def _apply_retention(self, *, protect: set[int]) -> list[int]:
        if self._keep_last is None:
            return []
        committed, every = self._scan()
        newest_first = sorted(committed, reverse=True)
        keep = set(newest_first[: self._keep_last]) | protect
        if self._resumed_step is not None:
            keep.add(self._resumed_step)
        doomed = [step for step in newest_first if step not in keep]
        if newest_first:
            doomed += [step for step in every - committed if step < newest_first[0] and step not in keep]
        for step in sorted(doomed):
            self._delete_step(step)
        return sorted(doomed)

    def _delete_step(self, step: int) -> None:
        directory = self.checkpoint_dir(step)
        backend = self._layout.backend
        backend.delete(f"{directory}/{POINTER_NAME}")
        backend.delete_prefix(directory)
        logger.info("retention deleted checkpoint step %d under %s", step, self.root)

    def _scan(self) -> tuple[set[int], set[int]]:
        """(committed steps, every step with a directory)."""
        layout = self._layout
        every: set[int] = set()
        committed: set[int] = set()
        if layout.is_local:
            root = local_path(layout.root)
            with translated_os_errors(layout.root, "listing"):
                try:
                    names = os.listdir(root)
                except FileNotFoundError:
                    return set(), set()
                for name in names:
                    match = _STEP_DIR.match(name)
                    if match and (root / name).is_dir():
                        every.add(int(match.group(1)))
                        if (root / name / POINTER_NAME).is_file():
                            committed.add(int(match.group(1)))
            return committed, every
        base = _without_scheme(layout.root) + "/"
        for uri in layout.backend.list_prefix(layout.root):
            relative = _without_scheme(uri)
            if not relative.startswith(base):
                continue
            segments = relative[len(base) :].split("/")
            match = _STEP_DIR.match(segments[0])
            if match is None or len(segments) < 2:
                continue
            every.add(int(match.group(1)))
            if segments[1:] == [POINTER_NAME]:
                committed.add(int(match.group(1)))
        return committed, every


def _without_scheme(uri: str) -> str:
    return uri.split("://", 1)[-1].strip("/")
