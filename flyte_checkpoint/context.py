"""The task context: checkpoint locations for the running attempt, and how task code reaches them.

It sits above the checkpoint helper: :attr:`TaskContext.checkpoint` builds the helper and hands
it this attempt's number, run and action, so the helper never asks for the running task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint import running
from flyte_checkpoint.environment import (
    ATTEMPT_NUMBER_ENV,
    LOCAL_RANK_ENV,
    LOCAL_WORLD_SIZE_ENV,
    MASTER_ADDR_ENV,
    MASTER_PORT_ENV,
    RANK_ENV,
    WORLD_SIZE_ENV,
    _int_from_env,
    attempt_number_from_env,
)
from flyte_checkpoint.errors import ConfigurationError, NoTaskCheckpointError
from flyte_checkpoint.single.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint
from flyte_checkpoint.storage.options import TransferSettings

__all__ = [
    "ATTEMPT_NUMBER_ENV",
    "CheckpointPaths",
    "ContextProvider",
    "TaskContext",
    "attempt_number_from_env",
    "ctx",
    "current_attempt_number",
    "current_checkpoint",
    "register_context_provider",
    "task_context",
    "unregister_context_provider",
]


class CheckpointPaths(BaseModel):
    """Where the running attempt saves (``checkpoint_path``) and restores from (``prev_checkpoint_path``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prev_checkpoint_path: str | None = None
    checkpoint_path: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskContext:
    """What a running task attempt knows about itself.

    Frozen, except for ``data``: the one mutable store, which caches the checkpoint helper.
    ``attempt_number`` is this attempt's 0-based number; when not given it is read from
    ``FLYTE_ATTEMPT_NUMBER`` once, when the context is made (0 when unset). Retry runners and
    platform integrations pass it explicitly, so two runners in one process never share it.
    """

    checkpoint_paths: CheckpointPaths | None = None
    run_name: str | None = None
    action_name: str | None = None
    storage_options: Mapping[str, Any] | None = None
    transfer: TransferSettings | None = None
    attempt_number: int = dataclasses.field(default_factory=attempt_number_from_env)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        number = self.attempt_number
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ConfigurationError(f"attempt_number must be a whole number >= 0, got {number!r}")

    @property
    def checkpoint(self) -> Checkpoint | None:
        """This attempt's checkpoint helper, built on first access and then always the same object.

        ``None`` when the context has no checkpoint paths, or the destination is ``None`` or only
        whitespace. The helper repairs a remote previous-checkpoint URI with this context's run
        name, action name and attempt number.
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
            transfer=self.transfer,
            run_name=self.run_name,
            action_name=self.action_name,
            attempt_number=self.attempt_number,
        )
        # setdefault keeps one helper even when two threads race through the first access.
        winner = self.data.setdefault(CHECKPOINT_CACHE_KEY, helper)
        assert isinstance(winner, Checkpoint)
        return winner

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


ContextProvider = Callable[[], "TaskContext | None"]
"""A function :func:`ctx` asks for the running task when no :func:`task_context` block is active."""


def register_context_provider(provider: ContextProvider) -> None:
    """Let :func:`ctx` ask ``provider()`` for the running task when no ``task_context`` is active.

    This is how a platform integration (e.g. :mod:`flyte_checkpoint.integrations.flyte`) makes
    task code written against :func:`ctx` run unchanged on that platform. ``provider`` returns the
    platform's running task as a :class:`TaskContext`, or ``None`` outside one; it is called on
    every such :func:`ctx` call, from any thread, so it should be cheap. Providers registered later
    are asked first; the first non-``None`` answer wins. Registering the same provider twice keeps
    one entry.
    """
    running.add_provider(provider)


def unregister_context_provider(provider: ContextProvider) -> None:
    """Stop asking ``provider``; a provider that is not registered is ignored."""
    running.remove_provider(provider)


def ctx() -> TaskContext | None:
    """The :class:`TaskContext` of the running task, or ``None`` outside a task.

    The innermost :func:`task_context` block wins; without one, the registered context providers
    are asked (see :func:`register_context_provider`).
    """
    found = running.running_attempt()
    return found if isinstance(found, TaskContext) else None


def current_attempt_number() -> int:
    """The running task's attempt number: its :class:`TaskContext`'s, else ``FLYTE_ATTEMPT_NUMBER``."""
    context = ctx()
    return context.attempt_number if context is not None else attempt_number_from_env()


@contextlib.contextmanager
def task_context(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` the current task context for the block (per thread and asyncio task)."""
    with running.entered(context):
        yield context


def current_checkpoint() -> Checkpoint:
    """The running task's checkpoint helper, for typed code: never ``None``.

    ``ctx().checkpoint`` is typed optional twice (no task; no checkpoint paths), which
    ``mypy --strict`` makes every task check; this raises instead, saying how to run the task.

    Raises:
        NoTaskCheckpointError: outside a task, or in a task given no checkpoint location.
    """
    current = ctx()
    if current is None:
        raise NoTaskCheckpointError(
            "no task is running, so there is no checkpoint: call this inside a task run by "
            "run_with_retries, load_and_run_task or `flyte-checkpoint run`, a Flyte task (after "
            "flyte_checkpoint.integrations.flyte.install()), or a `with task_context(...)` block"
        )
    helper = current.checkpoint
    if helper is None:
        raise NoTaskCheckpointError(
            "the running task was given no checkpoint location (its TaskContext has no "
            "checkpoint_paths.checkpoint_path); pass CheckpointPaths(checkpoint_path=...) to it"
        )
    return helper
