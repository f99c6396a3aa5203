"""One background upload at a time per checkpoint helper, with the newest request winning."""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - imported first: its exit hook must run after ours
import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator

from flyte_checkpoint.errors import InputChangedError, PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.single.saving.job import SaveJob
from flyte_checkpoint.storage.base import WriteGate
from flyte_checkpoint.timebounds import Deadline

logger = logging.getLogger("flyte_checkpoint")

_live: weakref.WeakSet[BackgroundSaver] = weakref.WeakSet()
"""Every saver with an upload queued or in flight."""
_live_lock = threading.Lock()

_BEGIN_SECONDS = 1.0
"""How long a save interrupted inside ``Thread.start()`` waits to learn whether the upload
thread exists (one that was created begins within milliseconds)."""


def _forget_in_child() -> None:
    """A fork child has none of its parent's upload threads: its exit must not wait for them."""
    global _live, _live_lock
    _live, _live_lock = weakref.WeakSet(), threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


class BackgroundSaver:
    """Runs save jobs in a worker thread: one in flight, at most one queued.

    The newest state wins. A request arriving while another is queued (not yet started)
    *supersedes* it: the queued snapshot is dropped, because a newer state of the same checkpoint
    makes it worthless, and the caller never waits for an upload it no longer needs. A failure is
    kept and raised by the next :meth:`submit` or :meth:`wait`, unless a newer save was submitted
    after the failed one: then that newer save decides. If it succeeds, the older failure is
    logged at WARNING and never raised (the checkpoint holds a newer state than the one that
    failed); if it fails too, its failure is raised instead. The worker thread exits when idle.

    When the main thread ends with an upload in flight, the interpreter waits for it (see
    :func:`finish_at_exit`) before anything it needs is shut down, on every store.
    """

    def __init__(self, upload: Callable[[SaveJob, WriteGate], None], name: str) -> None:
        """``upload(job, gate)`` performs one save; every write waits for ``gate`` (the pause)."""
        self._upload = upload
        self._name = name
        self._condition = threading.Condition()
        self._submitted = 0  # sequence number of the newest submitted snapshot
        self._queued: tuple[int, SaveJob] | None = None
        self._busy = False
        self._error: tuple[int, BaseException] | None = None
        self._pausers = 0
        self._may_upload = threading.Event()
        self._may_upload.set()
        self._hold: threading.Timer | None = None
        self.superseded = 0

    def _pause(self) -> None:
        """Stop the upload in flight at its next write (lock held); undone by :meth:`_unpause`."""
        self._pausers += 1
        self._may_upload.clear()

    def _unpause(self) -> None:
        """Undo one :meth:`_pause` (lock held): the upload goes on once no pause is left."""
        self._pausers -= 1
        if self._pausers == 0:
            self._may_upload.set()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the upload in flight at its next write while the caller takes a snapshot.

        Both are Python code: an upload thread keeping the GIL busy made every system call of a
        snapshot wait for it, and the caller of a background save waited 4-5 times longer. The
        upload loses only the few milliseconds the snapshot takes.
        """
        with self._condition:
            self._pause()
        try:
            yield
        finally:
            with self._condition:
                self._unpause()

    @property
    def busy(self) -> bool:
        """Whether an upload is queued or in flight."""
        with self._condition:
            return self._busy

    def hold(self, seconds: float) -> None:
        """Hold the upload in flight at its next write for up to ``seconds``, for a newer save.

        For a task that has taken a preemption notice over: in the documented loop it now
        writes its newest state and saves it, blocking, and an older upload using the cores and
        the disk meanwhile only slows that down (a 192 MiB state took 0.5-0.7 s to write beside
        one, 0.1-0.25 s alone). The next save, :meth:`wait` or :meth:`submit` ends the hold (the
        blocking save holds the upload itself while it runs); if none comes, the upload resumes
        when the hold runs out. Does nothing when no upload is in flight or one hold is on.
        """
        with self._condition:
            if not self._busy or self._hold is not None:
                return
            self._pause()
            self._hold = threading.Timer(seconds, self.release_hold)
            self._hold.daemon = True
            self._hold.start()

    def release_hold(self) -> None:
        """End the hold of :meth:`hold`, if one is on."""
        with self._condition:
            hold, self._hold = self._hold, None
            if hold is not None:
                hold.cancel()
                self._unpause()

    @contextlib.contextmanager
    def superseding(self) -> Iterator[None]:
        """Hold the upload in flight, and drop the queued one, while the caller saves a newer state.

        For the final save after a preemption notice, which cannot afford to wait for an older
        upload. The held upload resumes when the block ends: its helper's commit order then ends
        it at its next write if the newer save committed, and lets it go on if that one failed.
        """
        with self._condition:
            self._drop_queued()
        with self.paused():
            self.release_hold()  # this save holds the upload now, and lets it go when it ends
            yield
        with self._condition:  # the newer state committed: an older failure no longer matters
            if self._error is not None:
                self._log_overtaken(self._error[1], "succeeded")
                self._error = None

    def submit(self, job: SaveJob) -> None:
        """Queue ``job`` for upload, replacing a queued one.

        Raises the failure of the newest earlier save first (and drops ``job``), except an
        :class:`InputChangedError` (its input rewritten in place: ``job`` is the newer state);
        the failure of a save that a newer one superseded waits for that newer one's outcome.
        """
        self.release_hold()
        with self._condition:
            # An InputChangedError (the input rewritten in place) is not raised here: ``job``
            # carries the newer state and decides, and its snapshot copies the rewritten files.
            if (
                self._error is not None
                and self._error[0] == self._submitted
                and not isinstance(self._error[1], InputChangedError)
            ):
                job.discard()
                self._raise_pending_error()
            # Queue the newer job before discarding the one it replaces, and count the upload
            # busy and live before its thread starts: a Ctrl-C landing anywhere here then
            # leaves either job queued whole (never one with its snapshot half removed), no
            # queue without a thread to upload it, and no thread that wait() does not see.
            dropped, self._queued = self._queued, (self._submitted + 1, job)
            self._submitted += 1
            if not self._busy:
                self._start_uploading()
            self._supersede(dropped)

    def _start_uploading(self) -> None:
        """Start the upload thread, counted busy and live first (lock held)."""
        self._busy = True
        with _live_lock:
            _live.add(self)
        began = threading.Event()

        def run() -> None:
            began.set()
            self._run()

        thread = threading.Thread(target=run, name=f"flyte-checkpoint-save {self._name}")
        try:
            thread.start()
        except BaseException:
            # Interrupted inside start(): the thread may exist already, and runs once this lock
            # is released. Only one that never began leaves the count to be undone.
            if not began.wait(_BEGIN_SECONDS):
                self._busy = False
                with _live_lock:
                    _live.discard(self)
            raise

    def _drop_queued(self) -> None:
        """Discard the snapshot waiting for its upload: a newer state is on its way (lock held)."""
        dropped, self._queued = self._queued, None
        self._supersede(dropped)

    def _supersede(self, dropped: tuple[int, SaveJob] | None) -> None:
        """Discard ``dropped``, a job already taken off the queue (lock held)."""
        if dropped is not None:
            try:
                dropped[1].discard()
            finally:
                self.superseded += 1
                logger.debug("background save of %s superseded by a newer one", self._name)

    def wait(self, *, until: Deadline | None = None) -> None:
        """Block until nothing is queued or in flight; raise the failure of the newest failed save.

        A failure is raised only if no newer save succeeded after it (the newest state wins).
        With ``until`` (a preemption's save deadline), a wait still unfinished then raises
        :class:`PreemptionDeadlineError`; the upload goes on.
        A :meth:`hold` ends first: the caller waits for the upload, so it must go on.
        """
        self.release_hold()
        with self._condition:
            while self._busy:
                left = None if until is None else until.remaining()
                if left is not None and left <= 0:
                    raise PreemptionDeadlineError(
                        f"the background save of {self._name} did not commit before the save "
                        "deadline of the preemption notice; it goes on uploading until the process "
                        "ends, and the previous checkpoint is kept unless it commits first"
                    )
                self._condition.wait(left)
            self._raise_pending_error()

    def _raise_pending_error(self) -> None:
        pending, self._error = self._error, None
        if pending is not None:
            raise pending[1]

    def _run(self) -> None:
        while True:
            with self._condition:
                if self._queued is None:
                    self._busy = False
                    with _live_lock:
                        _live.discard(self)
                    self._condition.notify_all()
                    return
                (sequence, job), self._queued = self._queued, None
            try:
                self._upload(job, self._may_upload)
            except BaseException as error:  # kept for the caller; a thread has nobody to raise to
                if hasattr(error, "add_note"):
                    error.add_note(f"flyte_checkpoint: raised by a background save of {self._name}")
                with self._condition:
                    self._record_failure(sequence, error)
            else:
                with self._condition:
                    self._forget_older_failure(sequence)
            finally:
                job.discard()

    def _record_failure(self, sequence: int, error: BaseException) -> None:
        if self._error is not None:
            self._log_overtaken(self._error[1], "failed too")
        self._error = (sequence, error)
        if self._queued is None:
            logger.error("background save of %s failed: %s", self._name, error)

    def _forget_older_failure(self, sequence: int) -> None:
        if self._error is not None and self._error[0] < sequence:
            self._log_overtaken(self._error[1], "succeeded")
            self._error = None

    def _log_overtaken(self, error: BaseException, outcome: str) -> None:
        logger.warning(
            "background save of %s failed, and a newer background save %s, so the newest state "
            "wins and this failure is not raised: %s",
            self._name,
            outcome,
            error,
        )


def finish_at_exit() -> None:
    """Wait for every background upload in flight, then log (never raise) their failures.

    Runs when the main thread has ended, before :mod:`concurrent.futures` refuses new work: the
    object stores' clients hand work to thread pools (name lookups, file reads), and an upload
    still running after that failed with "cannot schedule new futures after interpreter
    shutdown" and was lost, while the process exited 0. After a preemption notice the wait
    ends at the save deadline, so the process is gone before the SIGKILL.
    """
    with _live_lock:
        savers = list(_live)
    for saver in savers:
        logger.info("waiting for the background save of %s before the interpreter exits", saver._name)
        try:
            saver.wait(until=notice.save_deadline())
        except (KeyboardInterrupt, SystemExit):
            # Another Ctrl-C: stop waiting. Raised out of threading's shutdown, this also ends
            # its join of the upload's thread; the upload never commits, the previous object stays.
            logger.warning("stopped waiting for the background save of %s; it is abandoned", saver._name)
            raise
        except Exception as error:  # the interpreter is exiting: say it, loudly, and go on
            logger.error(
                "the background save of %s failed as the interpreter exited, so the checkpoint "
                "there is the previous one: %s",
                saver._name,
                error,
            )


# threading's exit hooks run when the main thread ends, newest first, before non-daemon threads
# are joined and before the interpreter tears anything down; concurrent.futures (imported above)
# registered its own earlier, so ours runs before it stops the thread pools.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:  # CPython 3.9+
    _register(finish_at_exit)
