"""Numbered DCP checkpoints (``root/step_<n>``) with retention, and loads that fall back to a good step."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from flyte_checkpoint.distributed import _state_bridge
from flyte_checkpoint.distributed.reader import CheckpointReader, CommittedMetadata, read_committed_metadata
from flyte_checkpoint.distributed.writer import CheckpointWriter, Retention
from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidCheckpointInputError,
    Preempted,
)
from flyte_checkpoint.preemption import handler, notice, ranks
from flyte_checkpoint.progress import ProgressCallback, log_transfer
from flyte_checkpoint.steps import RestoredStep, check_step
from flyte_checkpoint.storage import StorageOptions
from flyte_checkpoint.storage.deadline import finish_by
from flyte_checkpoint.storage.options import TransferSettings

if TYPE_CHECKING:  # recent torch only; named in a return annotation alone
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

logger = logging.getLogger("flyte_checkpoint")

T = TypeVar("T")


def checkpoint_failure(exc: BaseException) -> CheckpointError | None:
    """The first of our typed errors inside ``exc`` (a DCP ``CheckpointException`` gathers the
    exceptions of every failed rank), or ``None``."""
    if isinstance(exc, CheckpointError):
        return exc
    if isinstance(exc, CheckpointException):
        for rank in sorted(exc.failures):
            inner = exc.failures[rank][0]
            if isinstance(inner, CheckpointError):
                return inner
    return None


class DistributedCheckpointManager:
    """DCP checkpoints of numbered steps under ``root``, one atomic checkpoint directory per step.

    Call every method on every rank, as you call ``dcp.save``/``dcp.load``. ``save(step, sd)``
    writes ``root/step_<step>`` with :class:`CheckpointWriter`; after the commit the coordinator
    keeps only the newest ``keep_last`` committed steps (never the step resumed from). ``load(sd)``
    restores the newest committed step that verifies, falling back to older ones (and then to
    ``resume_from``, e.g. the previous Flyte attempt's root) with a warning naming the reason.

    Preemption: :meth:`reached_preemption` is the step at which every rank stops together::

        for step in range(start, steps):
            train_one_step()
            if manager.reached_preemption(step):        # every rank, same answer
                manager.save(step, state_dict)          # every rank saves this step
                raise manager.preemption()              # every rank exits
            if step % 100 == 0:
                manager.save(step, state_dict)

    A rank started without a runner (each ``torchrun`` worker, Flyte's ``Elastic`` tasks) needs
    no more: when no preemption handler is installed in the process, the first
    :meth:`reached_preemption` installs one (SIGTERM, ``grace_seconds``), and :meth:`close` (or
    leaving ``with manager:``) puts the previous signal handlers back.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep_last: int | None = None,
        storage_options: StorageOptions | None = None,
        transfer: TransferSettings | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        process_group: dist.ProcessGroup | None = None,
        grace_seconds: float | None = None,
    ) -> None:
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise InvalidCheckpointInputError(f"keep_last must be a positive int or None, not {keep_last!r}")
        self.root = _state_bridge.root_of(root)
        self.resume_from = _state_bridge.root_of(resume_from) if resume_from is not None else None
        self.keep_last = keep_last
        self.storage_options = dict(storage_options) if storage_options is not None else None
        self.transfer = transfer
        """This package's transfer settings (``None``: read from :attr:`storage_options`)."""
        self.process_group = process_group
        self.grace_seconds = notice.check_grace_seconds(grace_seconds) if grace_seconds is not None else None
        """The grace period of the handler :meth:`reached_preemption` installs (``None``:
        ``FLYTE_CHECKPOINT_GRACE_SECONDS``, else 30 s, read when it installs)."""
        self._handler: handler.PreemptionHandler | None = None
        self.resumed_step: int | None = None
        """The step of ``root`` the last successful :meth:`load` restored; retention keeps it."""
        self._last_commit: tuple[int, float] | None = None
        """The step the last :meth:`save` committed, and when (``time.monotonic()``)."""

    def checkpoint_dir(self, step: int) -> str:
        return _state_bridge.step_dir(self.root, check_step(step))

    def steps(self) -> list[int]:
        """The committed steps under ``root``, oldest first (a plain listing: call it on any rank)."""
        return _state_bridge.committed_steps(self.root, self.storage_options, self.transfer)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def writer(
        self, step: int, *, metadata: dict[str, Any] | None = None, progress: ProgressCallback | None = None
    ) -> CheckpointWriter:
        """The storage writer of ``step``, carrying this manager's retention."""
        retention = None
        if self.keep_last is not None:
            protect = {check_step(step)} | ({self.resumed_step} if self.resumed_step is not None else set())
            retention = Retention(self.root, self.keep_last, frozenset(protect))
        return CheckpointWriter(
            self.checkpoint_dir(step),
            storage_options=self.storage_options,
            transfer=self.transfer,
            metadata={"step": step, **(metadata or {})},
            retention=retention,
            progress=progress,
        )

    def save(
        self,
        step: int,
        state_dict: dict[str, Any],
        *,
        metadata: dict[str, Any] | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        """Save ``state_dict`` as ``step`` (replacing an earlier save of it atomically), then retain.

        ``progress(bytes_written, None)`` is told how far this rank's shard got (its size is
        known only once DCP has resolved every item), on every rank that gives one.

        After a preemption notice the save must commit by the save deadline (a margin before the
        expected SIGKILL): a rank's write that cannot is stopped with
        :class:`~flyte_checkpoint.errors.PreemptionDeadlineError`, DCP fails the save on every
        rank (its ``CheckpointException``; :func:`checkpoint_failure` gives ours), and the
        previous step stays the newest committed one.
        """
        writer = self.writer(step, metadata=metadata, progress=progress)
        with notice.save_in_flight(), finish_by(notice.save_deadline()):
            dcp_save(state_dict, storage_writer=writer, process_group=self.process_group)
        self._last_commit = (step, time.monotonic())

    def async_save(
        self,
        step: int,
        state_dict: dict[str, Any],
        *,
        metadata: dict[str, Any] | None = None,
        async_checkpointer_type: AsyncCheckpointerType = AsyncCheckpointerType.THREAD,
        progress: ProgressCallback | None = None,
    ) -> Future[Any] | AsyncSaveResponse:
        """Like :meth:`save`, in the background: ``dcp.async_save``'s future completes after the commit.

        ``progress`` is called from the thread that uploads; in ``AsyncCheckpointerType.PROCESS``
        mode the upload runs in another process, which cannot call it, so it is not called.
        """
        return dcp_async_save(
            state_dict,
            storage_writer=self.writer(step, metadata=metadata, progress=progress),
            process_group=self.process_group,
            async_checkpointer_type=async_checkpointer_type,
        )

    # ---------------------------------------------------------------- preemption

    def reached_preemption(self, step: int) -> bool:
        """Whether every rank stops at ``step`` for a preemption notice; the same answer on all.

        A collective, like :meth:`save`: call it on every rank of the group at the same step
        boundary. A notice on any one rank is enough (a spot node's SIGTERM reaches that node's
        ranks only); a rank that learns of it here records it, so its saves are bounded by the
        soonest deadline and :meth:`preemption` works on it too. On ``True`` save ``step`` on every
        rank and exit; see the class docstring. Ranks calling it at different steps all raise
        :class:`InvalidCheckpointInputError` instead of saving different steps.

        Cost: one all-reduce of three float64 values per call (a CPU tensor for gloo, the current
        CUDA device for nccl), within a few tenths of a millisecond of a bare all-reduce of the
        same size. ``benchmarks/preemption_ranks.py`` measures it: 3 to 5 ms per call with gloo
        and 4 ranks on a 2-core machine shared with other work (1 ms with 2 ranks), far less on an
        idle multi-core host. Call it every step when a step is long next to that (a second or
        more: under 1 %); otherwise every k steps, ``if step % k == 0 and
        manager.reached_preemption(step)``, with the same k on every rank, at the price of up to
        k - 1 steps of the grace period. Without a process group (or with one rank) it is this
        process's own notice, and no collective.

        With no preemption handler installed in the process (no runner), the first call installs
        one, from the main thread, until :meth:`close`: without it a SIGTERM would end the rank
        with nothing saved while this answered ``False``. Called from another thread then, it
        raises :class:`ConfigurationError`, since signal handlers can be set in the main thread only.
        """
        step = check_step(step)
        self._install_handler()
        return ranks.reached_preemption(step, self.process_group)

    def _install_handler(self) -> None:
        if handler.is_installed():  # a runner's, the Flyte plugin's, the task's own, or ours
            return
        if threading.current_thread() is not threading.main_thread():
            raise ConfigurationError(
                "reached_preemption() was called outside the main thread with no preemption handler "
                "installed, so a SIGTERM would end this rank with nothing saved; call "
                "flyte_checkpoint.install_preemption_handler() in the main thread before starting "
                "this thread (or run the task under a runner: run_with_retries, flyte-checkpoint run, "
                "the Flyte plugin)"
            )
        self._handler = handler.install_preemption_handler(grace_seconds=self.grace_seconds)
        logger.debug("preemption handler installed by the DCP manager of %s until close()", self.root)

    def close(self) -> None:
        """Uninstall the preemption handler :meth:`reached_preemption` installed, if it did (the
        signal handlers from before come back); call it in the main thread. Idempotent; the
        manager stays usable, and a later :meth:`reached_preemption` installs the handler again."""
        installed, self._handler = self._handler, None
        if installed is not None:
            installed.uninstall()

    def __enter__(self) -> DistributedCheckpointManager:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def preemption(self) -> Preempted:
        """The exception that ends this rank after :meth:`reached_preemption`: ``raise manager.preemption()``.

        Its message says whether this manager's save committed after the notice, and which step:
        the next attempt resumes from it. Raises :class:`RuntimeError` without a notice.
        """
        current = notice.current_notice()
        if current is None:
            raise RuntimeError("no preemption notice was received; check reached_preemption(step) first")
        committed = self._last_commit
        saved = committed is not None and committed[1] >= current.received_at
        if committed is not None and saved:
            detail = f"step {committed[0]} committed under {self.root}; the next attempt resumes from it"
        else:
            detail = (
                f"no step under {self.root} committed after the notice; the next attempt resumes from "
                "the newest earlier one, if any"
            )
        return notice.preempted_exit(current, detail=detail, saved=saved)

    # ---------------------------------------------------------------- load

    def load(
        self, state_dict: dict[str, Any], *, step: int | None = None, progress: ProgressCallback | None = None
    ) -> RestoredStep | None:
        """Restore ``step``, or the newest committed step that verifies; ``None`` when there is none.

        ``progress(bytes_read, total)`` is told how far this rank got through the shards it
        reads (``total``: their size); a fall-back to an older step starts it again from 0.

        With ``step=None`` a step whose metadata or any shard fails verification is skipped with a
        warning, and the next older one tried (those of ``root`` first, then of ``resume_from``);
        when none loads, :class:`CheckpointCorruptError` lists every reason. Any other failure is
        raised as is. An explicit ``step`` (of ``root``) is loaded or raises.
        """
        if step is not None:
            return self._load(self.root, check_step(step), state_dict, progress)
        # Listed by rank 0 for all: ranks listing on their own could race a save and disagree.
        own = self._agreed(self.steps)
        candidates = [(self.root, found) for found in reversed(own)]
        if self.resume_from is not None and self.resume_from != self.root:
            resume_root = self.resume_from
            found_there = self._agreed(
                lambda: _state_bridge.committed_steps(resume_root, self.storage_options, self.transfer)
            )
            candidates += [(resume_root, found) for found in reversed(found_there)]
        if not candidates:
            return None
        reasons: list[str] = []
        for index, (root, candidate) in enumerate(candidates):
            try:
                return self._load(root, candidate, state_dict, progress)
            except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
                reasons.append(f"{root} step {candidate}: {exc}")
                older = candidates[index + 1] if index + 1 < len(candidates) else None
                logger.warning(
                    "checkpoint step %d under %s failed verification, %s: %s",
                    candidate,
                    root,
                    f"falling back to step {older[1]} under {older[0]}"
                    if older
                    else "and no older step is left",
                    exc,
                )
        raise CheckpointCorruptError("no committed step could be loaded: " + "; ".join(reasons))

    def _load(
        self, root: str, step: int, state_dict: dict[str, Any], progress: ProgressCallback | None
    ) -> RestoredStep:
        started = time.monotonic()
        directory = _state_bridge.step_dir(root, step)
        committed = self._verified_metadata(directory)
        try:
            dcp_load(
                state_dict,
                storage_reader=CheckpointReader(
                    directory,
                    storage_options=self.storage_options,
                    transfer=self.transfer,
                    committed=committed,
                    progress=progress,
                ),
                process_group=self.process_group,
            )
        except BaseException as exc:
            failure = checkpoint_failure(exc)
            if failure is None or failure is exc:
                raise
            raise failure from exc
        if root == self.root:
            self.resumed_step = step
        shards = committed.shards.values()
        what = f"into this rank (DCP version {committed.version_id}, {len(shards)} shards in all)"
        log_transfer("loaded", directory, what, sum(shard.size for shard in shards), started)
        return RestoredStep(
            step=step,
            version_id=committed.version_id,
            checkpoint_dir=directory,
            metadata=committed.user_metadata,
        )

    def _verified_metadata(self, directory: str) -> CommittedMetadata:
        """The step's metadata, read on every rank; if any rank fails, every rank raises alike."""
        failure: CheckpointError | None = None
        committed: CommittedMetadata | None = None
        try:
            committed = read_committed_metadata(directory, self.storage_options, self.transfer)
        except (CheckpointCorruptError, CheckpointNotFoundError) as exc:
            failure = exc
        outcomes = self._gathered(None if failure is None else (type(failure).__name__, str(failure)))
        for rank, outcome in enumerate(outcomes):
            if outcome is not None and failure is None:
                kind, message = outcome
                error = (
                    CheckpointNotFoundError
                    if kind == CheckpointNotFoundError.__name__
                    else CheckpointCorruptError
                )
                failure = error(f"{message} (on rank {rank})")
        if failure is not None:
            raise failure
        assert committed is not None
        return committed

    # ---------------------------------------------------------------- agreement between ranks

    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _agreed(self, compute: Callable[[], T]) -> T:
        """``compute()`` as rank 0 of the group sees it, on every rank (listings may race a save).

        A failure on rank 0 is raised on every rank, so no rank waits for an answer that never comes.
        """
        if not self._distributed():
            return compute()
        answer: tuple[T | None, BaseException | None] = (None, None)
        if dist.get_rank(self.process_group) == 0:
            try:
                answer = (compute(), None)
            except CheckpointError as exc:
                answer = (None, exc)
        holder: list[Any] = [answer]
        source = 0 if self.process_group is None else dist.get_global_rank(self.process_group, 0)
        dist.broadcast_object_list(holder, src=source, group=self.process_group)
        value, error = holder[0]
        if error is not None:
            raise error
        return cast(T, value)

    def _gathered(self, value: T) -> Sequence[T]:
        if not self._distributed():
            return [value]
        gathered: list[T] = [value] * dist.get_world_size(self.process_group)
        dist.all_gather_object(gathered, value, group=self.process_group)
        return gathered
