"""One background upload at a time per checkpoint helper, with the newest request winning."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from flyte_checkpoint.snapshot import Snapshot

logger = logging.getLogger("flyte_checkpoint")


class BackgroundSaver:
    """Runs uploads of snapshots in a worker thread: one in flight, at most one queued.

    A request arriving while another is queued (not yet started) *supersedes* it: the queued
    snapshot is dropped, because a newer state of the same checkpoint makes it worthless, and the
    caller never waits for an upload it no longer needs. A failure is kept and raised by the next
    :meth:`submit` or :meth:`wait`. The worker thread exits when idle, and is not a daemon, so
    the interpreter finishes an upload in flight before exiting.
    """

    def __init__(self, upload: Callable[[Snapshot], None], name: str) -> None:
        self._upload = upload
        self._name = name
        self._condition = threading.Condition()
        self._queued: Snapshot | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._pausers = 0
        self._may_upload = threading.Event()
        self._may_upload.set()
        self.superseded = 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the upload in flight at its next write while the caller takes a snapshot.

        Both are Python code: an upload thread keeping the GIL busy made every system call of a
        snapshot wait for it, and the caller of a background save waited 4-5 times longer. The
        upload loses only the few milliseconds the snapshot takes.
        """
        with self._condition:
            self._pausers += 1
            self._may_upload.clear()
        try:
            yield
        finally:
            with self._condition:
                self._pausers -= 1
                if self._pausers == 0:
                    self._may_upload.set()

    def submit(self, snapshot: Snapshot) -> None:
        """Queue ``snapshot`` for upload, replacing a queued one; raise an earlier failure first."""
        with self._condition:
            try:
                self._raise_pending_error()
            except BaseException:
                snapshot.discard()
                raise
            if self._queued is not None:
                self._queued.discard()
                self.superseded += 1
                logger.debug("background save of %s superseded by a newer one", self._name)
            snapshot.gate = self._may_upload
            self._queued = snapshot
            if not self._busy:
                self._busy = True
                threading.Thread(target=self._run, name=f"flyte-checkpoint-save {self._name}").start()

    def wait(self) -> None:
        """Block until nothing is queued or in flight; raise the failure of any background save."""
        with self._condition:
            while self._busy:
                self._condition.wait()
            self._raise_pending_error()

    @property
    def pending(self) -> bool:
        """Whether an upload is queued or in flight."""
        with self._condition:
            return self._busy

    def _raise_pending_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._condition:
                snapshot, self._queued = self._queued, None
                if snapshot is None:
                    self._busy = False
                    self._condition.notify_all()
                    return
            try:
                self._upload(snapshot)
            except BaseException as error:  # kept for the caller; a thread has nobody to raise to
                if hasattr(error, "add_note"):
                    error.add_note(f"flyte_checkpoint: raised by a background save of {self._name}")
                logger.error("background save of %s failed: %s", self._name, error)
                with self._condition:
                    self._error = error
            finally:
                snapshot.discard()
