"""Numbered checkpoints under one root (``step_1000``, ``step_2000``, ...) with retention and fall-back."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.state.acks import Worker
from flyte_checkpoint.state.checkpoint import StateCheckpoint
from flyte_checkpoint.state.components import PICKLE, ComponentOrActor, Serializer
from flyte_checkpoint.state.layout import POINTER_NAME, Layout
from flyte_checkpoint.state.manifest import Manifest, PartAck
from flyte_checkpoint.state.parts import PartData
from flyte_checkpoint.state.waiting import DEFAULT_TIMEOUT, LockLike
from flyte_checkpoint.steps import RestoredStep, check_step, step_dir_name, step_of_dir_name
from flyte_checkpoint.storage import StorageOptions
from flyte_checkpoint.storage.options import TransferSettings

logger = logging.getLogger("flyte_checkpoint")


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
        transfer: TransferSettings | None = None,
        serializer: Serializer = PICKLE,
        timeout: float = DEFAULT_TIMEOUT,
        max_workers: int | None = None,
    ) -> None:
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise InvalidCheckpointInputError(f"keep_last must be a positive int or None, not {keep_last!r}")
        self._layout = Layout.of(root, storage_options, transfer)
        # Checked once here, so a bad setting fails at construction rather than at the first save.
        self._settings = StateCheckpoint(
            self._layout.root,
            storage_options=storage_options,
            transfer=transfer,
            serializer=serializer,
            timeout=timeout,
            max_workers=max_workers,
        )
        self._keep_last = keep_last
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
        return self._layout.join(step_dir_name(check_step(step)))

    def at(self, step: int) -> StateCheckpoint:
        """The checkpoint of ``step``, with this manager's configuration (for ranks and loads).

        Saving through it skips retention: use :meth:`save`, :meth:`commit` or
        :meth:`commit_version` for that.
        """
        settings = self._settings
        return StateCheckpoint(
            self.checkpoint_dir(step),
            storage_options=settings.storage_options,
            transfer=settings.transfer,
            serializer=settings.serializer,
            timeout=settings.timeout,
            max_workers=settings.max_workers,
        )

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
            manifest = self.at(step).manifest()
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
        controller: ComponentOrActor | None,
        parts: Sequence[ComponentOrActor],
        metadata: dict[str, Any] | None = None,
        lock: LockLike | None = None,
        progress: ProgressCallback | None = None,
    ) -> Manifest:
        """Save ``step`` (atomically replacing an earlier save of the same step), then apply retention."""
        manifest = self.at(step).save(
            controller=controller, parts=parts, metadata=metadata, lock=lock, progress=progress
        )
        self._retain_after(step)
        return manifest

    def begin(self, step: int, *, version_id: str | None = None) -> str:
        """Start a multi-process save of ``step``; see :meth:`StateCheckpoint.begin`."""
        return self.at(step).begin(version_id)

    def commit(
        self,
        step: int,
        version_id: str,
        *,
        world_size: int,
        controller: PartData | None = None,
        metadata: dict[str, Any] | None = None,
        workers: Mapping[int, Worker] | Sequence[Worker] | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Commit a multi-process save of ``step`` from acks in storage, then apply retention.

        See :meth:`StateCheckpoint.commit`.
        """
        manifest = self.at(step).commit(
            version_id,
            world_size=world_size,
            controller=controller,
            metadata=metadata,
            workers=workers,
            lock=lock,
        )
        self._retain_after(step)
        return manifest

    def commit_version(
        self,
        step: int,
        version_id: str,
        acks: Sequence[PartAck],
        *,
        controller: PartData | None = None,
        metadata: dict[str, Any] | None = None,
        lock: LockLike | None = None,
    ) -> Manifest:
        """Commit a save of ``step`` from gathered acks, then apply retention.

        See :meth:`StateCheckpoint.commit_version`.
        """
        manifest = self.at(step).commit_version(
            version_id, acks, controller=controller, metadata=metadata, lock=lock
        )
        self._retain_after(step)
        return manifest

    def load(
        self,
        step: int | None = None,
        *,
        controller: ComponentOrActor | None,
        parts: Sequence[ComponentOrActor],
        lock: LockLike | None = None,
        progress: ProgressCallback | None = None,
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
            return self._load_step(check_step(step), controller, parts, lock, progress)
        candidates = sorted(self._scan()[0], reverse=True)
        if not candidates:
            return None
        reasons: list[str] = []
        for index, candidate in enumerate(candidates):
            try:
                return self._load_step(candidate, controller, parts, lock, progress)
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
        self,
        step: int,
        controller: ComponentOrActor | None,
        parts: Sequence[ComponentOrActor],
        lock: LockLike | None,
        progress: ProgressCallback | None = None,
    ) -> RestoredStep:
        manifest = self.at(step).load(controller=controller, parts=parts, lock=lock, progress=progress)
        self._resumed_step = step
        return RestoredStep(
            step=step,
            version_id=manifest.version_id,
            checkpoint_dir=self.checkpoint_dir(step),
            metadata=dict(manifest.metadata),
        )

    def apply_retention(self, *, protect: Iterable[int] = ()) -> list[int]:
        """Delete what ``keep_last`` no longer keeps; returns the deleted steps.

        Kept: the newest ``keep_last`` committed steps, the step this manager resumed from, and
        the steps in ``protect`` (a step just committed, another manager's resumed step).
        Also deleted: directories of saves that never committed, when a newer step is committed
        (they can never be loaded). A step is deleted pointer first, so a crash midway leaves an
        uncommitted directory, never a committed but incomplete checkpoint.
        """
        if self._keep_last is None:
            return []
        committed, every = self._scan()
        newest_first = sorted(committed, reverse=True)
        keep = set(newest_first[: self._keep_last]) | set(protect)
        if self._resumed_step is not None:
            keep.add(self._resumed_step)
        doomed = [step for step in newest_first if step not in keep]
        if newest_first:
            doomed += [step for step in every - committed if step < newest_first[0] and step not in keep]
        for step in sorted(doomed):
            self._delete_step(step)
        return sorted(doomed)

    def _retain_after(self, step: int) -> None:
        try:
            self.apply_retention(protect={step})
        except CheckpointError as exc:
            # The save is committed; retention is housekeeping that the next save retries.
            logger.warning("retention under %s failed (the next save retries): %s", self.root, exc)

    def _delete_step(self, step: int) -> None:
        directory = self.checkpoint_dir(step)
        backend = self._layout.backend
        backend.delete(f"{directory}/{POINTER_NAME}")
        backend.delete_prefix(directory)
        logger.info("retention deleted checkpoint step %d under %s", step, self.root)

    def _scan(self) -> tuple[set[int], set[int]]:
        """(committed steps, every step directory).

        Step directories are the root's children (so an empty one, or one holding only an
        unfinished write, is listed where the backend shows directories); committed ones are
        those whose pointer one recursive listing finds.
        """
        backend = self._layout.backend
        every = {
            step
            for name in backend.list_children(self._layout.root)
            if (step := step_of_dir_name(name)) is not None
        }
        base = _without_scheme(self._layout.root) + "/"
        committed: set[int] = set()
        for uri in backend.list_prefix(self._layout.root):
            relative = _without_scheme(uri)
            if not relative.startswith(base):
                continue
            segments = relative[len(base) :].split("/")
            step = step_of_dir_name(segments[0])
            if step is not None and segments[1:] == [POINTER_NAME]:
                committed.add(step)
        return committed, every | committed


def _without_scheme(uri: str) -> str:
    # Stores may list under another spelling of the scheme than the one given (az:// vs abfs://).
    return uri.split("://", 1)[-1].strip("/")
