"""The saves of one helper to its destination: blocking or in the background, in call order,
within the time a preemption notice leaves.

The one owner of a helper's :class:`~.background.BackgroundSaver`, its
:class:`~.order.CommitOrder` and its :class:`~.budget.SaveDurations`. Every save goes through
:meth:`SaveScheduler.save` as a :class:`~.job.SaveJob` built once, and reaches the store
through :func:`flyte_checkpoint.single.transfer.save` alone.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from flyte_checkpoint import archive
from flyte_checkpoint.errors import PreemptionDeadlineError
from flyte_checkpoint.incremental import ChunkStore
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.single.saving.background import BackgroundSaver
from flyte_checkpoint.single.saving.budget import SaveDurations
from flyte_checkpoint.single.saving.job import SaveJob, SaveTimes
from flyte_checkpoint.single.saving.order import CommitOrder, OrderedGate
from flyte_checkpoint.single.saving.snapshot import Snapshot, take_snapshot
from flyte_checkpoint.single.transfer import SaveRequest, save
from flyte_checkpoint.storage import Backend
from flyte_checkpoint.storage.base import WriteGate
from flyte_checkpoint.storage.deadline import finish_by
from flyte_checkpoint.storage.retry import RetryPolicy

logger = logging.getLogger("flyte_checkpoint")


@dataclass(frozen=True)
class Destination:
    """Where and how a helper's saves are stored."""

    uri: str
    backend: Backend
    retry: RetryPolicy
    compression_level: int = archive.DEFAULT_COMPRESSION_LEVEL
    chunk_store: ChunkStore | None = None
    """Where incremental saves of a directory put their chunks (``None``: no incremental saves)."""


class SaveScheduler:
    """Runs the saves of one helper; see :meth:`Checkpoint.save_sync` for what a caller sees.

    Before a notice, a blocking save first waits for the background ones, so saves land in
    call order. After a notice the blocking (final) save does not wait: the background upload
    in flight is paused while the final one uses the time left, and the commit order keeps the
    older one from ever committing over it.
    """

    def __init__(self, destination: Destination) -> None:
        self._destination = destination
        self._order = CommitOrder()
        self._durations = SaveDurations()
        self._saver: BackgroundSaver | None = None
        self._held_for: notice.PreemptionNotice | None = None
        self._last_save: SaveTimes | None = None

    @property
    def last_save(self) -> SaveTimes | None:
        """What the newest save that committed cost (``None`` before one did)."""
        return self._last_save

    @property
    def durations(self) -> SaveDurations:
        """The durations of this helper's saves, that saves after a notice are judged by."""
        return self._durations

    @property
    def superseded(self) -> int:
        """How many queued background saves a newer one replaced before they started."""
        return 0 if self._saver is None else self._saver.superseded

    def save(
        self,
        content: bytes | Path,
        *,
        background: bool,
        progress: ProgressCallback | None,
        incremental: bool = False,
    ) -> None:
        """Save ``content`` (validated by the caller), now or in the background; a directory
        with ``incremental`` into the destination's chunk store."""
        uri = self._destination.uri
        asked_at = time.monotonic()
        if background:
            self._durations.check_fits(content, uri, older_in_flight=self._uploading())
            saver = self._background_saver()
            ticket = self._order.ticket()
            with saver.paused():
                snapshot = take_snapshot(content, Path(tempfile.gettempdir()))
            saver.submit(SaveJob(snapshot, ticket, progress, asked_at=asked_at, incremental=incremental))
            return
        # After a notice the final save overtakes the background one in flight instead of waiting.
        overtaken = self._saver if notice.current_notice() is not None else None
        if overtaken is None:
            self.wait()
        try:
            self._durations.check_fits(content, uri, older_in_flight=self._uploading())
        except PreemptionDeadlineError:
            if overtaken is not None:
                overtaken.release_hold()  # the older upload is now the one left to commit
            raise
        job = SaveJob(
            Snapshot(content), self._order.ticket(), progress, asked_at=asked_at, incremental=incremental
        )
        with overtaken.superseding() if overtaken is not None else contextlib.nullcontext():
            if notice.current_notice() is None:
                self._upload(job, None)
            else:
                _shielded(functools.partial(self._upload, job, None), uri)

    def take_over(self, current: notice.PreemptionNotice) -> None:
        """The task took ``current`` over: hold the background upload in flight for its final save.

        Once per notice, for up to half the time left before the save deadline (see
        :meth:`BackgroundSaver.hold` for why and what ends the hold).
        """
        if self._held_for is current:
            return
        self._held_for = current
        deadline = notice.save_deadline()
        if self._saver is not None and deadline is not None:
            self._saver.hold(deadline.remaining() / 2)

    def wait(self) -> None:
        """Block until background saves are done; raise the failure of the newest that failed.

        After a notice the wait ends at the save deadline with :class:`PreemptionDeadlineError`.
        """
        if self._saver is not None:
            self._saver.wait(until=notice.save_deadline())

    def settle(self) -> str | None:
        """Wait for the background saves in flight, up to the save deadline; what kept them from
        committing (their failure is reported here, so a later wait does not raise it again)."""
        uri = self._destination.uri
        try:
            self.wait()
        except PreemptionDeadlineError:
            return (
                f"the background save to {uri} in flight did not commit before the save "
                "deadline (it goes on until the process ends)"
            )
        except Exception as error:
            return f"the background save to {uri} in flight failed: {error}"
        return None

    def _uploading(self) -> bool:
        """Whether a background save of this helper is queued or in flight."""
        return self._saver is not None and self._saver.busy

    def _background_saver(self) -> BackgroundSaver:
        if self._saver is None:
            self._saver = BackgroundSaver(self._upload, self._destination.uri)
        return self._saver

    def _upload(self, job: SaveJob, pause: WriteGate | None) -> None:
        destination, order, ticket = self._destination, self._order, job.ticket
        snapshot = job.snapshot
        request = SaveRequest(
            content=job.content,
            compression_level=destination.compression_level,
            progress=job.progress,
            gate=None if pause is None else OrderedGate(pause, order, ticket, destination.uri),
            check_unchanged=snapshot.verify_unchanged,
            shown_as=snapshot.user_path,
            commit_turn=lambda: order.turn(ticket, destination.uri),
            chunk_store=destination.chunk_store if job.incremental else None,
        )
        with notice.save_in_flight(), finish_by(notice.save_deadline()):
            try:
                snapshot.complete()
                with self._durations.measure(job.content), snapshot.errors_for_the_caller():
                    save(destination.backend, destination.uri, request, retry=destination.retry)
                self._last_save = times = job.times(background=pause is not None)
                logger.debug(
                    "saved %s: staged in %.3f s (%d bytes copied), durable after %.3f s",
                    destination.uri,
                    times.staged_seconds,
                    times.copied_bytes,
                    times.durable_seconds,
                )
            except Exception as error:
                # Once a newer save committed, this one is not a failure, whatever it raised (its
                # SupersededError, or its transfer bound passing while it was paused): the
                # checkpoint holds a newer state than this save's.
                if not order.superseded(ticket):
                    raise
                logger.info(
                    "a newer save to %s committed first, so this older one was discarded: %s",
                    destination.uri,
                    error,
                )


def _shielded(save: Callable[[], None], uri: str) -> None:
    """Run the final save after a notice in a thread of its own, so that nothing raised *into*
    the caller's thread meanwhile cuts it short; raise that afterwards.

    A notice seldom comes alone. A SIGTERM sent to the whole process group (Slurm's ``scancel``,
    ``tini -g``, torchrun's agent) also ends a PyTorch DataLoader's fork workers, and the
    DataLoader's SIGCHLD handler then raises ``RuntimeError`` in the main thread: it landed in
    the final save, which was lost (the preemption benchmark's fork-children configuration lost
    up to 19 steps a preemption that way). Python runs signal handlers in the main thread only,
    so the save, bounded by the save deadline as ever, now runs beside it, and the main thread
    only waits: an exception raised into that wait is kept and raised once the save has ended
    (our own ``Preempted``, for a task that does not read the notice, comes out the same way).
    """
    context = contextvars.copy_context()  # the running attempt, as the caller sees it
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()
    began = threading.Event()

    def run() -> None:
        began.set()
        try:
            context.run(save)
        except BaseException as error:  # handed to the caller's thread, which raises it
            outcome.set_exception(error)
        else:
            outcome.set_result(None)

    thread = threading.Thread(target=run, name=f"flyte-checkpoint-final-save {uri}")
    kept: list[BaseException] = []
    try:
        thread.start()
    except BaseException as raised:
        # Mostly raised while start() waits for the new thread to begin, which then runs the
        # save (a loaded machine may run the whole save before this thread returns). Raised in
        # the few bytecodes before the thread exists, it never begins: then there is nothing
        # to wait for and the exception goes up at once, as it would have before the save.
        kept.append(raised)
        if not _deferring(lambda: began.wait(_BEGIN_SECONDS), kept, uri):
            raise
        _say_deferred(raised, uri)
    _deferring(lambda: concurrent.futures.wait([outcome]), kept, uri)
    if kept:
        raise kept[0]
    outcome.result()


T = TypeVar("T")

_BEGIN_SECONDS = 10.0
"""How long a started final-save thread may take to run its first line (a loaded machine's
scheduling delay, with a wide margin) before an interrupted start is taken to have failed."""


def _deferring(wait: Callable[[], T], kept: list[BaseException], uri: str) -> T:
    """``wait()``, called again until it returns, keeping what signal handlers raise into it."""
    while True:
        try:
            return wait()
        except BaseException as raised:  # from a signal handler, into this wait
            if not kept:
                _say_deferred(raised, uri)
            kept.append(raised)


def _say_deferred(raised: BaseException, uri: str) -> None:
    logger.warning(
        "%s was raised while the final save to %s ran; it is raised once that save has ended",
        type(raised).__name__,
        uri,
    )
