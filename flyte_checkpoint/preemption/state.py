"""What this process knows about preemption, in one object: :data:`STATE`.

The notice it received (:class:`PreemptionNotice`) and whether the task took it over, the exit
time a notice keeps free, the saves in flight, and what the preemption handler installed. The
modules of this package read and change it (:mod:`.notice`, :mod:`.handler`); this one only holds
it, and gives a fork child a fresh one.

A fork child (a DataLoader worker, a pool process) is not the task that was told: one
``os.register_at_fork`` hook puts back the signal handlers that were there before ours (SIGTERM
ends the child as it always did, a daemon child does not hang its parent's exit, its signals never
reach the parent's watcher) and forgets the notice, the take-over, the parent's saves in flight
and its installation, with fresh locks (another thread of the parent may have held one at the
fork). How busy the machine is (:attr:`PreemptionState.load_factor`) and when the notice was last
cleared are facts of the machine and of time, and carry over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Protocol

from flyte_checkpoint.errors import Preempted
from flyte_checkpoint.preemption.arrival import ArrivalWatcher

DEFAULT_GRACE_SECONDS = 30.0
"""Kubernetes' default ``terminationGracePeriodSeconds``: SIGTERM, then SIGKILL 30 s later."""
MAX_MARGIN_SHARE = 0.5
"""The most of the grace period kept free to exit: the other half stays the final save's."""

SignalHandler = Callable[[int, FrameType | None], Any] | int | None
"""What ``signal.signal`` returns and takes: a Python function, ``SIG_DFL``/``SIG_IGN``, or ``None``."""
Deliver = Callable[[Preempted], None]
"""Ends an attempt with the given ``Preempted``; called in the handler's watcher thread."""


@dataclass(frozen=True)
class PreemptionNotice:
    """This process was told it will be stopped: by what, when, and when the SIGKILL is due."""

    source: str
    """``"SIGTERM"``, ``"SIGUSR1"``, ... or a cloud's notice (``"aws-spot"``, ``"gce-preempted"``,
    ``"azure-scheduled-event"``)."""
    signal: int | None
    """The signal number, for a signal; ``None`` for a cloud notice."""
    received_at: float
    """``time.monotonic()`` when the notice arrived."""
    grace_seconds: float
    """Seconds from the notice to the expected SIGKILL."""
    exit_seconds: float = 0.0
    """Seconds the process is expected to take to exit after its last save
    (:func:`~flyte_checkpoint.preemption.notice.exit_seconds`)."""

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` at which the SIGKILL is expected."""
        return self.received_at + self.grace_seconds

    def time_left(self) -> float:
        """Seconds until the expected SIGKILL (0 once it is due)."""
        return max(0.0, self.deadline - time.monotonic())

    @property
    def margin(self) -> float:
        """Seconds kept free before the deadline: for the process to report and exit."""
        return safety_margin(self.grace_seconds, self.exit_seconds)

    def describe(self) -> str:
        """E.g. ``"SIGTERM 2.1 s ago (SIGKILL expected in 27.9 s)"``."""
        ago = time.monotonic() - self.received_at
        return f"{self.source} {ago:.1f} s ago (SIGKILL expected in {self.time_left():.1f} s)"


def safety_margin(grace_seconds: float, exit_seconds: float = 0.0) -> float:
    """The time kept free before the expected SIGKILL for the process to exit after its last save.

    ``exit_seconds`` (what the exit is expected to take), but at least a tenth of the grace
    period between 0.05 and 5 seconds (never more than a quarter of it), and never more than
    half the grace period. The exit is not free: an outside harness measured 0.16-0.83 s from
    the last commit to the exit (interpreter teardown, atexit hooks, thread joins, the runner's
    report), and a margin of a tenth of a one-second grace period got every process SIGKILLed.
    A larger margin costs only saves refused for lack of time, hence the cap.
    """
    floor = min(grace_seconds / 4, max(0.05, min(5.0, grace_seconds / 10)))
    return min(grace_seconds * MAX_MARGIN_SHARE, max(floor, exit_seconds))


class Stoppable(Protocol):
    """A watcher the handler started and stops with its last uninstall (the clouds' watcher)."""

    def stop(self) -> None: ...


class HandlerState:
    """What the preemption handler installed, shared by every ``PreemptionHandler`` of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # taken by install/uninstall only, never by the handler
        self.users = 0
        self.previous: dict[int, SignalHandler] = {}
        """Each signal ours is installed on, and the handler it replaced."""
        self.grace_seconds = DEFAULT_GRACE_SECONDS
        self.end_main_thread = True
        self.ending: Preempted | None = None
        """Set by the watcher just before it signals the main thread, to end it with this."""
        self.stop = threading.Event()
        self.watcher: threading.Thread | None = None
        self.cloud: Stoppable | None = None
        self.deliverers: list[Deliver] = []
        """Where endings go instead of the main thread, innermost last."""
        self.arrivals: ArrivalWatcher | None = None
        """Records each signal when it arrives, however late Python runs the handler."""

    def put_back(self, signum: int) -> None:
        """Reinstall the handler ``signum`` had before ours (the default when it had none from Python)."""
        previous = self.previous[signum]
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def give_back_in_child(self) -> None:
        """In a fork child: the handlers of before ours, and the wakeup fd of before the arrival
        watcher (its socket is shared with the parent: the child's signals would read as the
        parent's)."""
        for signum in self.previous:
            with contextlib.suppress(ValueError, OSError):
                self.put_back(signum)
        if self.arrivals is not None:
            self.arrivals.forget_in_child()


class PreemptionState:
    """Everything this process knows about preemption; the one instance is :data:`STATE`."""

    def __init__(self) -> None:
        self.notice: PreemptionNotice | None = None
        """The notice this process received; replaced in one assignment (atomic for every thread
        and for the interrupted code), so a signal handler may set it."""
        self.taken_over = False
        """Whether task code read the notice: it stops by itself, the handler does not end it."""
        self.attempts_running = 0
        """Runners' attempts whose task code runs now (nested runners count each)."""
        self.between_attempts = False
        """Whether a runner's attempt ended and no other has started: there is no task code for
        the handler to end, only the runner's own, which handles the ending itself."""
        self.cleared_at = float("-inf")
        """``time.monotonic()`` of the last clear (a runner starting another attempt)."""
        self.clear_lock = threading.Lock()
        self.exit_expected = False
        """Whether a handler is installed, so the process exits when preempted."""
        self.exit_override: float | None = None
        """The exit time the installer set, instead of the estimate."""
        self.load_factor = 1.0
        """How much slower than on an idle machine CPU work runs now (1 to 4)."""
        self.saves = threading.Condition()
        """Guards :attr:`saves_in_flight`; notified when a save ends."""
        self.saves_in_flight = 0
        self.handler = HandlerState()

    def forget_in_child(self) -> None:
        """Start a fork child afresh: see the module docstring."""
        self.handler.give_back_in_child()
        self.handler = HandlerState()  # the parent's threads did not come along; its lock may have been held
        self.notice, self.taken_over = None, False
        self.attempts_running, self.between_attempts = 0, False
        self.exit_expected, self.exit_override = False, None  # the child has the handlers of before ours
        self.clear_lock = threading.Lock()
        self.saves, self.saves_in_flight = threading.Condition(), 0


STATE = PreemptionState()
"""This process's preemption state."""


def _forget_in_child() -> None:
    STATE.forget_in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_forget_in_child)
