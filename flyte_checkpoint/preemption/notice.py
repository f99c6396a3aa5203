"""The preemption notice: that this process will be killed soon, and by when.

A signal handler (:mod:`.handler`) or a cloud watcher records the notice with :func:`notify`;
everything else reads it in ordinary code. Recording only assigns one attribute of the process's
preemption state (:data:`.state.STATE`; no locks, no I/O, no logging), so it is safe at any
instant of the interrupted main thread.

The deadline is when the SIGKILL is expected: the notice's time plus the grace period, which
comes from the argument of whoever installed the handler, else ``FLYTE_CHECKPOINT_GRACE_SECONDS``,
else :data:`DEFAULT_GRACE_SECONDS` (Kubernetes' ``terminationGracePeriodSeconds`` default).
Saves made after the notice finish by :func:`save_deadline`, a margin before it that keeps the
time the process needs to exit (:func:`safety_margin`, :func:`exit_seconds`).
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flyte_checkpoint.errors import ConfigurationError, Preempted, PreemptionDeadlineError
from flyte_checkpoint.preemption.state import (
    DEFAULT_GRACE_SECONDS,
    MAX_MARGIN_SHARE,
    STATE,
    PreemptionNotice,
    safety_margin,
)
from flyte_checkpoint.timebounds import Deadline

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "EXIT_BASE_SECONDS",
    "EXIT_SECONDS_ENV",
    "EXIT_SECONDS_PER_BLOCK",
    "GRACE_SECONDS_ENV",
    "MAX_LOAD_FACTOR",
    "MAX_MARGIN_SHARE",
    "PreemptionNotice",
    "check_exit_seconds",
    "check_grace_seconds",
    "clear",
    "current_notice",
    "estimated_exit_seconds",
    "exit_seconds",
    "exit_seconds_from_env",
    "expect_exit",
    "grace_seconds_from_env",
    "notify",
    "notify_arrival",
    "notify_signal",
    "preempted_exit",
    "preemption_of",
    "refresh_load_factor",
    "runner_left",
    "safety_margin",
    "save_deadline",
    "save_in_flight",
    "saves_in_flight",
    "stop_expecting_exit",
    "take_over",
    "taken_over",
    "task_code_ended",
    "task_code_running",
    "wait_for_saves",
]

GRACE_SECONDS_ENV = "FLYTE_CHECKPOINT_GRACE_SECONDS"
EXIT_SECONDS_ENV = "FLYTE_CHECKPOINT_EXIT_SECONDS"
"""Seconds this process takes from its last save to its exit, when the estimate falls short."""
EXIT_BASE_SECONDS = 0.05
"""The exit work of any process: the runner's report, joining this package's threads, flushing."""
EXIT_SECONDS_PER_BLOCK = 0.2e-6
"""Interpreter teardown per object block the process holds (``sys.getallocatedblocks()``: what
the exit frees one by one). Measured from the last line printed to the exit on a two-core
machine at load 9.6 (so stretched by the full :data:`MAX_LOAD_FACTOR`), with the exit's last
garbage collection skipped after a notice (:func:`_exit_quickly_after_a_notice`): 0.03-0.04 s
for 137 k blocks (this package alone), 0.03-0.12 s for 457 k (the three cloud filesystems),
0.15-0.38 s for 606 k (torch), 0.50-0.70 s for 1.5 M (lightning); that is 0.1 µs a block on an
idle machine, taken twice over here. With the collection, the same exits took 0.3-5.4 s."""
MAX_LOAD_FACTOR = 4.0
"""The most the exit estimate is stretched for a busy machine (:func:`refresh_load_factor`)."""


def preempted_exit(current: PreemptionNotice, *, detail: str, saved: bool | None = None) -> Preempted:
    """The :class:`Preempted` that ends a task for ``current``, its message ending in ``detail``."""
    return Preempted(
        f"preempted by {current.describe()}: {detail}",
        source=current.source,
        signal=current.signal,
        saved=saved,
    )


def preemption_of(failure: BaseException, account: Preempted | None = None) -> Preempted | None:
    """The :class:`Preempted` that a failure after the notice stands for; ``None`` without one.

    After a notice the machine is going away, so a failure then (the save at the notice refused
    for lack of time, a process the SIGTERM ended) is the preemption's doing. ``account`` is the
    attempt helper's own (:meth:`Checkpoint.preemption`, which knows whether a save committed).
    """
    current = STATE.notice
    if current is None:
        return None
    ending = account or preempted_exit(current, detail="whether a save committed after it is not known here")
    ending.message += f"; the attempt then failed with {type(failure).__name__}: {failure}"
    return ending


def grace_seconds_from_env(default: float = DEFAULT_GRACE_SECONDS) -> float:
    """``FLYTE_CHECKPOINT_GRACE_SECONDS`` (``default`` when unset or blank); a clear error when malformed."""
    value = _seconds_from_env(
        GRACE_SECONDS_ENV,
        zero_allowed=False,
        remedy="set it to the time between SIGTERM and SIGKILL (Kubernetes: "
        "terminationGracePeriodSeconds) or unset it for 30 s",
    )
    return default if value is None else value


def exit_seconds_from_env() -> float | None:
    """``FLYTE_CHECKPOINT_EXIT_SECONDS`` (``None`` when unset or blank); a clear error when malformed."""
    return _seconds_from_env(
        EXIT_SECONDS_ENV,
        zero_allowed=True,
        remedy="set it to the time this process takes to exit after its last save (atexit hooks, "
        "threads it waits for), or unset it to let the package estimate it",
    )


def _seconds_from_env(name: str, *, zero_allowed: bool, remedy: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 if zero_allowed else value > 0) or value == float("inf"):
        raise ConfigurationError(
            f"{name}={raw!r} is not a number of seconds {'>=' if zero_allowed else '>'} 0; {remedy}"
        )
    return value


def check_exit_seconds(value: float | None) -> float | None:
    """``value`` if it is a valid exit time, the configured one for ``None``; else a clear error."""
    if value is None:
        return exit_seconds_from_env()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ConfigurationError(
            "exit_seconds must be a number of seconds >= 0 (the time the process takes to exit "
            f"after its last save), got {value!r}"
        )
    return float(value)


def estimated_exit_seconds() -> float:
    """What this process's exit is expected to take, from the objects it holds (interpreter
    teardown frees them one by one: torch's takes over half a second) and how busy the machine
    is. Under 0.1 ms, no I/O: safe in a signal handler."""
    return (EXIT_BASE_SECONDS + EXIT_SECONDS_PER_BLOCK * sys.getallocatedblocks()) * STATE.load_factor


def refresh_load_factor() -> None:
    """Measure how much slower than on an idle machine CPU work runs now: the runnable tasks per
    CPU this process may use (the one-minute load average), between 1 and :data:`MAX_LOAD_FACTOR`.
    On a 2-CPU machine at load 12 a teardown of 0.1 s took 0.45 s. Reads ``/proc``: called
    at install and from the watcher thread, never from a signal handler."""
    try:
        load = os.getloadavg()[0]
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    except OSError:  # no load average here: take the machine as idle
        return
    STATE.load_factor = min(MAX_LOAD_FACTOR, max(1.0, load / max(cpus, 1)))


def expect_exit(exit_seconds: float | None) -> None:
    """A preemption handler is installed (its process exits when preempted): notices from now on
    keep ``exit_seconds`` free to exit, or :func:`estimated_exit_seconds` at the notice for ``None``."""
    STATE.exit_expected, STATE.exit_override = True, exit_seconds
    refresh_load_factor()


def stop_expecting_exit() -> None:
    """The last handler was uninstalled: notices recorded without one keep only the floor."""
    STATE.exit_expected, STATE.exit_override = False, None


def exit_seconds() -> float:
    """The exit time a notice recorded now keeps free: the configured one, else the estimate, while
    a handler is installed; 0 without one (a notice recorded by a test or a library call)."""
    if STATE.exit_override is not None:
        return STATE.exit_override
    return estimated_exit_seconds() if STATE.exit_expected else 0.0


def check_grace_seconds(value: float | None) -> float:
    """``value`` if it is a valid grace period, the configured one for ``None``; else a clear error."""
    if value is None:
        return grace_seconds_from_env()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise ConfigurationError(
            "grace_seconds must be a number of seconds > 0 (the time between SIGTERM and SIGKILL), "
            f"got {value!r}"
        )
    return float(value)


# -- the notice ------------------------------------------------------------------------------


def notify(
    source: str, grace_seconds: float, signum: int | None = None, *, received_at: float | None = None
) -> PreemptionNotice:
    """Record a notice; a later one counts only if its deadline is sooner. Safe in a signal handler.

    ``received_at`` (``time.monotonic()``) is when it arrived, when that is known to be earlier
    than now (:mod:`.arrival`).
    """
    arrived_at = time.monotonic() if received_at is None else received_at
    arrived = PreemptionNotice(source, signum, arrived_at, grace_seconds, exit_seconds())
    current = STATE.notice
    if current is None or arrived.deadline < current.deadline:
        STATE.notice = arrived  # one assignment: atomic for every thread and for the interrupted code
        return arrived
    return current


def notify_signal(signum: int, grace_seconds: float, *, received_at: float | None = None) -> PreemptionNotice:
    """:func:`notify` for a signal, named as ``signal.Signals`` names it."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return notify(name, grace_seconds, signum, received_at=received_at)


def current_notice() -> PreemptionNotice | None:
    """The notice this process received, or ``None``."""
    return STATE.notice


def take_over() -> None:
    """Task code reads the notice (``checkpoint.preempted``): it decides when to stop, so the
    handler's watcher no longer ends the main thread for it once saves are done."""
    STATE.taken_over = True


def taken_over() -> bool:
    """Whether task code took the notice over (:func:`take_over`)."""
    return STATE.taken_over


@contextmanager
def task_code_running() -> Iterator[None]:
    """Around a runner's call of one attempt's task code: once it has returned or raised, the
    handler no longer ends the main thread (:func:`task_code_ended`) until another attempt's
    code runs. Otherwise an ending meant for the attempt that just ended, decided by the watcher
    a moment before, would be raised in the runner's own code as it retries, and out of it."""
    STATE.attempts_running += 1
    STATE.between_attempts = False
    try:
        yield
    finally:
        STATE.attempts_running -= 1
        STATE.between_attempts = STATE.attempts_running == 0


def task_code_ended() -> bool:
    """Whether a runner's attempt has ended and no other attempt's task code runs yet."""
    return STATE.between_attempts


def runner_left() -> None:
    """A preemption handler was uninstalled (a runner is done): the code that runs on is no
    runner's attempt, and is ended like any other when it does not handle a notice."""
    STATE.between_attempts = False


def clear() -> None:
    """Forget the notice (and the take-over): a runner starting another attempt in this process."""
    with STATE.clear_lock:
        STATE.notice = None
        STATE.taken_over = False
        STATE.cleared_at = time.monotonic()


def notify_arrival(signum: int, grace_seconds: float, received_at: float) -> None:
    """:func:`notify_signal` for a signal a watcher thread saw arrive at ``received_at``.

    The watcher may run only after the notice was handled and cleared for the next attempt (it
    needs the GIL, and its record comes after the handler's): an arrival dated before the last
    :func:`clear` belonged to an attempt that already ended, and is dropped. The check and the
    record are one step against :func:`clear` (never called from a signal handler).
    """
    with STATE.clear_lock:
        if received_at >= STATE.cleared_at:
            notify_signal(signum, grace_seconds, received_at=received_at)


def save_deadline() -> Deadline | None:
    """When a save must have committed by, or ``None`` without a notice; a save it stops raises
    :class:`PreemptionDeadlineError` (the storage layer takes it as is: ``finish_by``)."""
    notice = STATE.notice
    if notice is None:
        return None
    reason = (
        f"the save deadline of the {notice.source} preemption notice ({notice.margin:.2f} s before "
        f"the SIGKILL expected {notice.grace_seconds:.1f} s after the notice)"
    )
    return Deadline.until(notice.deadline - notice.margin, reason=reason, error_type=PreemptionDeadlineError)


# -- saves in flight, process-wide ------------------------------------------------------------


@contextmanager
def save_in_flight() -> Iterator[None]:
    """Count the block as a save in flight (never entered from a signal handler)."""
    saves = STATE.saves
    with saves:
        STATE.saves_in_flight += 1
    try:
        yield
    finally:
        with saves:
            STATE.saves_in_flight -= 1
            saves.notify_all()


def saves_in_flight() -> int:
    """How many saves of this process are in flight."""
    return STATE.saves_in_flight


def wait_for_saves(until: float) -> bool:
    """Wait until no save is in flight or ``time.monotonic()`` reaches ``until``; whether none is."""
    saves = STATE.saves
    with saves:
        while STATE.saves_in_flight:
            left = until - time.monotonic()
            if left <= 0:
                return False
            saves.wait(min(left, 0.25))
        return True


def _exit_quickly_after_a_notice() -> None:
    """Spare a preempted process the interpreter's last garbage collection.

    At exit the interpreter walks every object that is still alive once more for cycles. With
    an object store's client loaded that walk took 1.2-2.4 s of the grace period on a busy
    machine (0.1-0.2 s with it spared; local disk: 0.4 s against 0.02 s), time the SIGKILL
    does not give. After a notice the objects alive now are frozen out of it (``gc.freeze``):
    what remains is to tear the interpreter down. ``atexit`` runs the newest hook first, and
    this one is registered when the package is imported, so the task's own hooks have run by
    then: only the collection is skipped, never a hook. Cyclic garbage is not finalised then,
    which the interpreter never promised at exit anyway.
    """
    if STATE.notice is not None:
        gc.freeze()


atexit.register(_exit_quickly_after_a_notice)
