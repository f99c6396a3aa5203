"""The task context: checkpoint locations for the running attempt, and how task code reaches them.

A leaf module: it imports nothing of this package but its errors, so every other module (the
checkpoint helper included) can ask :func:`ctx` for the running task. The helper class is imported
only when :attr:`TaskContext.checkpoint` first builds one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.errors import ConfigurationError

if TYPE_CHECKING:
    from flyte_checkpoint.checkpoint import Checkpoint

# What a platform's container sets for each attempt (0-based); Flyte's executor does.
ATTEMPT_NUMBER_ENV = "FLYTE_ATTEMPT_NUMBER"

# The variables torchrun (and torch.distributed.launch, Lightning, Accelerate) set for each process.
RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
MASTER_ADDR_ENV = "MASTER_ADDR"
MASTER_PORT_ENV = "MASTER_PORT"


_LAUNCHER_HINT = "the launcher (e.g. torchrun) sets it, so check how this process was started, or unset it"


def _int_from_env(name: str, default: int, minimum: int, meaning: str, hint: str = _LAUNCHER_HINT) -> int:
    """``int(os.environ[name])`` (``default`` when unset or blank); a clear error when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigurationError(f"{name}={raw!r} is not {meaning}; {hint}")
    return value


def attempt_number_from_env() -> int:
    """The 0-based attempt number in ``FLYTE_ATTEMPT_NUMBER`` (0 when unset); a clear error when malformed."""
    return _int_from_env(
        ATTEMPT_NUMBER_ENV,
        0,
        0,
        "an integer >= 0",
        "set it to the 0-based attempt number or unset it",
    )


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
        # Imported here, not at the top: checkpoint.py asks this module for the running task.
        from flyte_checkpoint.checkpoint import CHECKPOINT_CACHE_KEY, Checkpoint

        cached = self.data.get(CHECKPOINT_CACHE_KEY)
        if isinstance(cached, Checkpoint):
            return cached
        prev = paths.prev_checkpoint_path
        with task_context(self):  # the helper's URI repair reads this context's attempt number
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

ContextProvider = Callable[[], "TaskContext | None"]
"""A function :func:`ctx` asks for the running task when no :func:`task_context` block is active."""

_providers_lock = threading.Lock()
_providers: tuple[ContextProvider, ...] = ()


def register_context_provider(provider: ContextProvider) -> None:
    """Let :func:`ctx` ask ``provider()`` for the running task when no ``task_context`` is active.

    This is how a platform integration (e.g. :mod:`flyte_checkpoint.integrations.flyte`) makes
    task code written against :func:`ctx` run unchanged on that platform. ``provider`` returns the
    platform's running task as a :class:`TaskContext`, or ``None`` outside one; it is called on
    every such :func:`ctx` call, from any thread, so it should be cheap. Providers registered later
    are asked first; the first non-``None`` answer wins. Registering the same provider twice keeps
    one entry.
    """
    global _providers
    with _providers_lock:
        if provider not in _providers:
            _providers = (provider, *_providers)


def unregister_context_provider(provider: ContextProvider) -> None:
    """Stop asking ``provider``; a provider that is not registered is ignored."""
    global _providers
    with _providers_lock:
        _providers = tuple(p for p in _providers if p != provider)


def ctx() -> TaskContext | None:
    """The :class:`TaskContext` of the running task, or ``None`` outside a task.

    The innermost :func:`task_context` block wins; without one, the registered context providers
    are asked (see :func:`register_context_provider`).
    """
    own = _current.get()
    if own is not None:
        return own
    for provider in _providers:  # a tuple replaced whole on change: safe to iterate unlocked
        found = provider()
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def task_context(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` the current task context for the block (per thread and asyncio task)."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
