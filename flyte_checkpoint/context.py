"""The task context: checkpoint locations for the running attempt, and how task code reaches them."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint
from flyte_checkpoint.uris import attempt_number_from_env


class CheckpointPaths(BaseModel):
    """Where the running attempt saves (``checkpoint_path``) and restores from (``prev_checkpoint_path``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prev_checkpoint_path: str | None = None
    checkpoint_path: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskContext:
    """What a running task attempt knows about itself.

    Frozen, except for ``data``: the one mutable store, which caches the checkpoint helper.
    """

    checkpoint_paths: CheckpointPaths | None = None
    run_name: str | None = None
    action_name: str | None = None
    storage_options: Mapping[str, Any] | None = None
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def checkpoint(self) -> Checkpoint | None:
        """This attempt's checkpoint helper, built on first access and then always the same object.

        ``None`` when the context has no checkpoint paths, or the destination is ``None`` or only
        whitespace.
        """
        paths = self.checkpoint_paths
        if paths is None or paths.checkpoint_path is None or not paths.checkpoint_path.strip():
            return None
        cached = self.data.get(CHECKPOINT_CACHE_KEY)
        if isinstance(cached, Checkpoint):
            return cached
        prev = paths.prev_checkpoint_path
        helper = Checkpoint(
            paths.checkpoint_path.strip(),
            prev.strip() if prev is not None else None,
            storage_options=self.storage_options,
            run_name=self.run_name,
            action_name=self.action_name,
        )
        # setdefault keeps one helper even when two threads race through the first access.
        winner = self.data.setdefault(CHECKPOINT_CACHE_KEY, helper)
        assert isinstance(winner, Checkpoint)
        return winner

    @property
    def attempt_number(self) -> int:
        """The 0-based attempt number from ``FLYTE_ATTEMPT_NUMBER`` (0 when unset)."""
        return attempt_number_from_env()


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "flyte_checkpoint_task_context", default=None
)


def ctx() -> TaskContext | None:
    """The :class:`TaskContext` of the running task, or ``None`` outside a task."""
    return _current.get()


@contextlib.contextmanager
def task_context(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` the current task context for the block (per thread and asyncio task)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
