"""Turning SIGTERM (or any chosen signal) into a preemption notice, and ending a task that does
not handle it once its saves are done.

The handler only records the notice (:func:`.notice.notify_signal`) and calls the handler that
was installed before it, if that was a Python function; nothing else happens inside it: no
I/O, no locks, no logging, so it cannot deadlock with the code it interrupted (Lightning's
intermittent hangs came from saving inside its handler). Everything else runs in a watcher
thread:

* a task that reads ``checkpoint.preempted`` (or ``time_left()``) has taken the notice over:
  it saves and stops when it decides to (the documented one-line loop);
* a task that never does is let run until every save in flight has committed (bounded by the
  deadline), then its main thread is ended: the watcher sends the signal again to that thread
  alone, and the handler raises :class:`~flyte_checkpoint.errors.Preempted` there (a
  ``SystemExit`` whose status is the signal's usual ``128 + signum``). ``finally`` blocks and
  ``with`` blocks run; the runners decide the exit. Under a runner, only the task code of an
  attempt is ended: once it has returned or raised, the runner has the notice, and an ending
  decided a moment before is dropped (:func:`.notice.task_code_running`).

A caller whose main thread runs an event loop (the async runner, the Flyte plugin) cannot let the
``Preempted`` be raised there: an exception a signal handler raises in the loop escapes the loop
itself, past every ``except`` of the task's caller. It hands the watcher a function that ends the
attempt its own way instead (:func:`ending_delivered_to`: cancelling the attempt's asyncio task).

Handlers can be installed from the main thread only (Python's rule); elsewhere installing does
nothing and says so in a DEBUG line. Installing again (a runner inside the Flyte plugin) reuses
the handlers in place; the last uninstall restores what was there before.

With ``FLYTE_CHECKPOINT_CLOUD_NOTICES`` set (:mod:`.cloud`), the first install also starts
watching the clouds named there for their earlier warning; the last uninstall stops it.

What is installed is kept in the process's preemption state (:attr:`.state.STATE.handler`), which
a fork child starts afresh with the handlers of before ours put back.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

from flyte_checkpoint.errors import ConfigurationError, Preempted
from flyte_checkpoint.preemption import arrival, cloud, notice
from flyte_checkpoint.preemption.state import STATE, Deliver, HandlerState, SignalHandler

logger = logging.getLogger("flyte_checkpoint")

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM,)
_POLL_SECONDS = 0.05
_AGAIN_MIN_SECONDS = 0.5
_LOAD_EVERY_SECONDS = 1.0
"""How often the watcher measures how busy the machine is, for the exit estimate."""
_REPLACED_FOR_SECONDS = 5.0
"""How long our handler must stay replaced before the watcher warns: a framework that installs
its own for a while and has ours reclaimed (Lightning's ``fit`` installs its handler just before
the sanity check or the first epoch, where our callback reclaims ours) is not warned of."""

__all__ = [
    "DEFAULT_SIGNALS",
    "Deliver",
    "PreemptionHandler",
    "ending_delivered_to",
    "install_preemption_handler",
    "is_installed",
    "reclaim_signals",
]


def _installed() -> HandlerState:
    """What is installed now (a fork child has a fresh one)."""
    return STATE.handler


def _on_arrival(signum: int, arrived_at: float) -> None:
    installed = _installed()
    if signum in installed.previous:
        notice.notify_arrival(signum, installed.grace_seconds, arrived_at)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    installed = _installed()
    ending = installed.ending
    if ending is not None:
        installed.ending = None
        if notice.task_code_ended():
            return  # the attempt ended after the watcher decided: its runner has the notice
        raise ending
    notice.notify_signal(signum, installed.grace_seconds)
    previous = installed.previous.get(signum)
    if callable(previous) and previous is not signal.default_int_handler:
        previous(signum, frame)


class PreemptionHandler:
    """The installed preemption handling; :meth:`uninstall` (or leaving ``with``) restores the
    signal handlers that were there before. See :func:`install_preemption_handler`."""

    def __init__(self, installed: bool) -> None:
        self.installed = installed
        """Whether this call installed anything (``False`` outside the main thread)."""
        self._done = False

    def uninstall(self) -> None:
        """Restore the previous handlers once the last installation is uninstalled (idempotent)."""
        if self._done or not self.installed:
            return
        self._done = True
        installed = _installed()
        with installed.lock:
            installed.users -= 1
            notice.runner_left()
            if installed.users:
                return
            for signum in installed.previous:
                installed.put_back(signum)
            installed.previous.clear()
            notice.stop_expecting_exit()
            arrivals, installed.arrivals = installed.arrivals, None
            if arrivals is not None:
                arrivals.stop()
            installed.stop.set()
            watcher, installed.watcher = installed.watcher, None
            clouds, installed.cloud = installed.cloud, None
        if clouds is not None:
            clouds.stop()
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()

    def __enter__(self) -> PreemptionHandler:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.uninstall()


def install_preemption_handler(
    signals: Iterable[int | signal.Signals] = DEFAULT_SIGNALS,
    *,
    grace_seconds: float | None = None,
    end_main_thread: bool = True,
    exit_seconds: float | None = None,
) -> PreemptionHandler:
    """Turn each of ``signals`` into a preemption notice (default: SIGTERM alone).

    ``grace_seconds`` is the time from the signal to the expected SIGKILL; ``None`` reads
    ``FLYTE_CHECKPOINT_GRACE_SECONDS`` (30 s when unset). SLURM's ``--signal=USR1@90`` wants
    ``signals=[signal.SIGUSR1], grace_seconds=90``. Saves after the notice must commit early
    enough for the process to exit before the SIGKILL: ``exit_seconds`` is the time it takes
    from its last save to its exit; ``None`` reads ``FLYTE_CHECKPOINT_EXIT_SECONDS``, else it is
    estimated at the notice from the objects the process holds (interpreter teardown) and the
    machine's load. Set it when atexit hooks or threads the exit waits for take longer. The
    margin kept is that, at least a tenth of the grace period and at most half of it. With
    ``end_main_thread`` (the default), a
    task that never reads ``checkpoint.preempted`` is ended once its saves in flight have
    committed (see the module docstring); ``False`` leaves stopping to the code entirely.

    Runners (:func:`~flyte_checkpoint.run_with_retries`, :func:`~flyte_checkpoint.load_and_run_task`,
    ``flyte-checkpoint run``, the Flyte plugin) install it themselves; call it for other entry
    points, from the main thread, best as a context manager::

        with install_preemption_handler(grace_seconds=60):
            train()
    """
    wanted = [_signal_number(each) for each in signals]
    if not wanted:
        raise ConfigurationError("signals is empty; name at least one, e.g. signal.SIGTERM")
    grace = notice.check_grace_seconds(grace_seconds)
    exiting = notice.check_exit_seconds(exit_seconds)
    if threading.current_thread() is not threading.main_thread():
        logger.debug("preemption handler not installed: signal handlers can be set in the main thread only")
        return PreemptionHandler(installed=False)
    clouds = cloud.cloud_notices_from_env()  # read before installing anything: a bad value fails first
    installed = _installed()
    with installed.lock:
        if installed.users == 0:
            installed.grace_seconds = grace
            installed.end_main_thread = end_main_thread
            notice.expect_exit(exiting)
            installed.ending = None
            installed.stop = threading.Event()
            installed.cloud = clouds.start() if clouds is not None else None
            try:
                installed.arrivals = arrival.ArrivalWatcher(_on_arrival)
            except (OSError, ValueError) as error:  # no socket, or a wakeup fd we may not set
                logger.debug("signal arrival times unavailable (the handler's time is used): %r", error)
        for signum in wanted:
            if signum not in installed.previous:
                installed.previous[signum] = signal.signal(signum, _on_signal)
        installed.users += 1
        if installed.watcher is None:
            installed.watcher = threading.Thread(
                target=_watch, args=(installed.stop,), name="flyte-checkpoint-preemption", daemon=True
            )
            installed.watcher.start()
    return PreemptionHandler(installed=True)


def is_installed() -> bool:
    """Whether a preemption handler is installed in this process (by anyone: a runner, the Flyte
    plugin, a manager, the task's own :func:`install_preemption_handler`)."""
    return _installed().users > 0


def reclaim_signals() -> tuple[int, ...]:
    """Put the installed handler back on those of its signals other code replaced; which those were.

    For a framework that installs its own handler for the length of a run: Lightning's ``Trainer``
    does for SIGTERM during ``fit`` (one that logs, and under DDP broadcasts, inside the handler,
    and chains to ours). Whoever replaced it restores ours when it restores its predecessor.
    Nothing happens outside the main thread or while no handler is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return ()
    installed = _installed()
    with installed.lock:
        replaced = tuple(each for each in installed.previous if signal.getsignal(each) is not _on_signal)
        for signum in replaced:
            signal.signal(signum, _on_signal)
    return replaced


def _signal_number(value: int | signal.Signals) -> int:
    try:
        return int(signal.Signals(value))
    except (ValueError, TypeError):
        raise ConfigurationError(
            f"{value!r} is not a signal; pass e.g. signal.SIGTERM or signal.SIGUSR1"
        ) from None


@contextmanager
def ending_delivered_to(deliver: Deliver) -> Iterator[None]:
    """In the block, a task that does not handle the notice is ended by ``deliver(preempted)``
    (called in the watcher thread) instead of by raising the ``Preempted`` in the main thread.

    For code whose main thread runs an event loop; see the module docstring. Nested blocks: the
    innermost one's ``deliver`` is used.
    """
    installed = _installed()
    with installed.lock:
        installed.deliverers.append(deliver)
    try:
        yield
    finally:
        with installed.lock:
            installed.deliverers.remove(deliver)


class _Replacements:
    """Our handlers that other code replaced, as the watcher sees them; each is warned of once."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}
        self._warned: set[int] = set()

    def check(self) -> None:
        now = time.monotonic()
        for signum in tuple(_installed().previous):
            installed = signal.getsignal(signum)
            if installed is _on_signal:
                self._since.pop(signum, None)
                continue
            since = self._since.setdefault(signum, now)
            if signum not in self._warned and now - since >= _REPLACED_FOR_SECONDS:
                self._warned.add(signum)
                logger.warning("%s", _replaced_warning(signum, installed))


def _replaced_warning(signum: int, installed: SignalHandler) -> str:
    name = signal.Signals(signum).name
    if installed == signal.SIG_IGN:
        effect = "SIG_IGN: the signal is ignored, so no preemption notice is recorded"
    elif installed == signal.SIG_DFL:
        effect = "SIG_DFL: the signal kills the process at once, with no final save"
    else:
        what = getattr(installed, "__qualname__", None) or repr(installed)
        effect = (
            f"{what}, which runs instead of it: the notice is still recorded when the signal "
            "arrives, but a task that does not read checkpoint.preempted is no longer ended once "
            "its saves have committed"
        )
    return (
        f"the {name} handler flyte_checkpoint installed for preemption was replaced by {effect}; "
        f"have the new handler call the one it replaced (signal.getsignal({name}) before "
        "installing it), or call flyte_checkpoint.preemption.reclaim_signals() after installing it"
    )


def _watch(stop: threading.Event) -> None:
    """End the attempt of a task that did not take the notice over, once its saves are done;
    warn when other code replaced our handler.

    The watcher outlives the attempt it ended: a runner retrying in this process clears the
    notice (:func:`.notice.clear`) and the next attempt is watched the same way.
    """
    ended: notice.PreemptionNotice | None = None
    again_at = 0.0
    replacements = _Replacements()
    measured = time.monotonic()
    while not stop.wait(_POLL_SECONDS):
        replacements.check()
        if time.monotonic() - measured >= _LOAD_EVERY_SECONDS and notice.current_notice() is None:
            notice.refresh_load_factor()  # here, not in the handler: it reads /proc
            measured = time.monotonic()
        current = notice.current_notice()
        if notice.task_code_ended():
            continue  # no task code to end: the runner deals with the attempt that ended
        if current is not None and current is ended and not notice.taken_over():
            now = time.monotonic()
            if now >= again_at and _installed().ending is None and now < current.deadline:
                # The attempt was told to end and is still running: C code that clears every
                # pending exception swallowed the Preempted its handler raised (torch's import of
                # numpy does, so a SIGTERM during ``import torch`` left the task running into the
                # SIGKILL). Tell it again, less often as the deadline nears.
                logger.warning(
                    "the task did not end when told to (its Preempted was swallowed); telling it again"
                )
                _end_attempt(notice.preempted_exit(current, detail="the task did not end when first told to"))
                again_at = _again_at(current)
            continue
        if current is None or current is ended or notice.taken_over() or not _installed().end_main_thread:
            continue
        logger.warning(
            "preemption notice: %s; the task does not handle it, so it ends once the saves in "
            "flight have committed",
            current.describe(),
        )
        until = current.deadline - current.margin
        done = False
        while not (done := notice.wait_for_saves(min(until, time.monotonic() + _POLL_SECONDS))):
            if notice.taken_over() or stop.is_set() or notice.task_code_ended() or time.monotonic() >= until:
                break  # the attempt's end too: there is no task code left to end
        if (
            notice.taken_over()
            or stop.is_set()
            or notice.current_notice() is not current
            or notice.task_code_ended()
        ):
            continue  # taken over, uninstalled, the attempt ended, or cleared by a runner starting another
        detail = (
            "the saves in flight committed first"
            if done
            else "a save still in flight did not commit in time; the previous checkpoint is kept "
            "unless it does"
        )
        ended = current
        _end_attempt(notice.preempted_exit(current, detail=detail))
        again_at = _again_at(current)


def _again_at(current: notice.PreemptionNotice) -> float:
    """When to tell an attempt that was told to end and still runs to end again: a quarter of the
    time left to exit, at least half a second on (its ``finally`` blocks and the runner's report
    need that time, and an exception raised into them would cut them short)."""
    now = time.monotonic()
    return now + max(_AGAIN_MIN_SECONDS, (current.deadline - current.margin - now) / 4)


def _end_attempt(ending: Preempted) -> None:
    installed = _installed()
    with installed.lock:
        deliver = installed.deliverers[-1] if installed.deliverers else None
    if deliver is not None:
        deliver(ending)
    else:
        _end_main_thread(ending)


def _end_main_thread(ending: Preempted) -> None:
    installed = _installed()
    signum = ending.signal if ending.signal in installed.previous else next(iter(installed.previous), None)
    if signum is None:
        return
    installed.ending = ending
    if installed.arrivals is not None:
        installed.arrivals.skip_next(signum)  # our own signal, not another notice
    signal.pthread_kill(threading.main_thread().ident or 0, signum)
