"""Which task attempt is running, as the layers below the task context see it.

:mod:`flyte_checkpoint.context` builds on this: its :class:`~flyte_checkpoint.context.TaskContext`
is a :class:`RunningAttempt`, its ``task_context`` block and context providers are the ones kept
here. The checkpoint helper asks :func:`running_attempt` (for the attempt number that repairs a
previous-attempt URI) without importing the context module, which imports the helper.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Protocol


class RunningAttempt(Protocol):
    """What the layers below the task context read of the running attempt."""

    @property
    def attempt_number(self) -> int: ...

    @property
    def run_name(self) -> str | None: ...

    @property
    def action_name(self) -> str | None: ...


AttemptProvider = Callable[[], "RunningAttempt | None"]
"""Asked for the running attempt when no :func:`entered` block is active (a platform's tasks)."""

_current: contextvars.ContextVar[RunningAttempt | None] = contextvars.ContextVar(
    "flyte_checkpoint_task_context", default=None
)
_providers_lock = threading.Lock()
_providers: tuple[AttemptProvider, ...] = ()


def add_provider(provider: AttemptProvider) -> None:
    """Ask ``provider`` first from now on (registering it again keeps one entry)."""
    global _providers
    with _providers_lock:
        if provider not in _providers:
            _providers = (provider, *_providers)


def remove_provider(provider: AttemptProvider) -> None:
    """Stop asking ``provider``; one that is not registered is ignored."""
    global _providers
    with _providers_lock:
        _providers = tuple(p for p in _providers if p != provider)


def running_attempt() -> RunningAttempt | None:
    """The innermost :func:`entered` attempt, else the first a provider names, else ``None``."""
    own = _current.get()
    if own is not None:
        return own
    for provider in _providers:  # a tuple replaced whole on change: safe to iterate unlocked
        found = provider()
        if found is not None:
            return found
    return None


@contextlib.contextmanager
def entered(attempt: RunningAttempt) -> Iterator[None]:
    """Make ``attempt`` the running one for the block (per thread and asyncio task)."""
    token = _current.set(attempt)
    try:
        yield
    finally:
        _current.reset(token)
