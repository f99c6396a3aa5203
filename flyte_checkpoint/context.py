"""The task context: checkpoint locations for the running attempt, and how task code reaches them."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint
from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.uris import attempt_number_from_env

# The variables torchrun (and torch.distributed.launch, Lightning, Accelerate) set for each process.
RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
MASTER_ADDR_ENV = "MASTER_ADDR"
MASTER_PORT_ENV = "MASTER_PORT"


def _int_from_env(name: str, default: int, minimum: int, meaning: str) -> int:
    """``int(os.environ[name])`` (``default`` when unset or blank); a clear error when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigurationError(
            f"{name}={raw!r} is not {meaning}; the launcher (e.g. torchrun) sets it, so check how "
            "this process was started, or unset it"
        )
    return value


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

    @property
    def rank(self) -> int:
        """This process's global rank from ``RANK`` (0 when unset), e.g. its part's position."""
        return _int_from_env(RANK_ENV, 0, 0, "a non-negative integer")

    @property
    def local_rank(self) -> int:
        """This process's rank on its node from ``LOCAL_RANK`` (0 when unset)."""
        return _int_from_env(LOCAL_RANK_ENV, 0, 0, "a non-negative integer")

    @property
    def world_size(self) -> int:
        """How many processes take part, from ``WORLD_SIZE`` (1 when unset)."""
        return _int_from_env(WORLD_SIZE_ENV, 1, 1, "a positive integer")

    @property
    def local_world_size(self) -> int:
        """How many processes run on this node, from ``LOCAL_WORLD_SIZE`` (1 when unset)."""
        return _int_from_env(LOCAL_WORLD_SIZE_ENV, 1, 1, "a positive integer")

    @property
    def master_addr(self) -> str | None:
        """The rendezvous host from ``MASTER_ADDR`` (``None`` when unset or blank)."""
        return os.environ.get(MASTER_ADDR_ENV, "").strip() or None

    @property
    def master_port(self) -> int | None:
        """The rendezvous port from ``MASTER_PORT`` (``None`` when unset)."""
        raw = os.environ.get(MASTER_PORT_ENV, "").strip()
        if not raw:
            return None
        port = _int_from_env(MASTER_PORT_ENV, 0, 1, "a TCP port number (1-65535)")
        if port > 65535:
            raise ConfigurationError(
                f"{MASTER_PORT_ENV}={raw!r} is not a TCP port number (1-65535); the launcher "
                "(e.g. torchrun) sets it, so check how this process was started, or unset it"
            )
        return port


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
