"""The task-facing checkpoint helper: restore the previous attempt's object, save the current one.

Over 600 lines by choice: it is one public class whose methods come as sync and async pairs,
and about 190 of its lines are their docstrings. The work is elsewhere: a save's scheduling in
``saving/``, encoding and the transfer in ``transfer.py``, the walk back in
``earlier_attempts.py``; splitting the class would split the public face it documents.
"""

from __future__ import annotations

import abc
import asyncio
import datetime
import logging
import os
import stat
import threading
from pathlib import Path
from types import TracebackType

from flyte_checkpoint import archive, running
from flyte_checkpoint.archive import ExtractionLimits
from flyte_checkpoint.environment import attempt_number_from_env
from flyte_checkpoint.errors import (
    CheckpointNotFoundError,
    InvalidCheckpointInputError,
    Preempted,
    UnsupportedTypeError,
    add_context,
    describe_error,
)
from flyte_checkpoint.incremental import (
    DEFAULT_GRACE,
    ChunkStore,
    CollectedGarbage,
    chunk_store_for,
    collect_garbage,
)
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.single.earlier_attempts import (
    MAX_WALK_BACK,
    RestoredFrom,
    discard_earlier_uploads,
    restore_newest,
)
from flyte_checkpoint.single.saving import Destination, SaveScheduler, SaveTimes
from flyte_checkpoint.single.transfer import load_object
from flyte_checkpoint.single.workspace import Workspace
from flyte_checkpoint.storage import (
    Backend,
    StorageOptions,
    backend_for,
)
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.uris import (
    attempt_uris,
    check_object_uri,
    clean_uri,
    is_local,
    local_path,
    repair_prev_checkpoint_uri,
    scheme_of,
)

logger = logging.getLogger("flyte_checkpoint")

CHECKPOINT_CACHE_KEY = "__flyte_checkpoint__"
"""The key under which :attr:`TaskContext.checkpoint` caches its helper in ``TaskContext.data``."""

SaveData = Path | str | os.PathLike[str] | bytes | bytearray | memoryview
"""What ``save`` takes: bytes-like data, or the path of a regular file or a directory."""


class BaseCheckpoint(abc.ABC):
    """The contract of a checkpoint helper: a local workspace, a load and a save, sync and async."""

    @property
    @abc.abstractmethod
    def path(self) -> Path:
        """The local directory where task code reads and writes checkpoint files."""

    @abc.abstractmethod
    def prev_exists(self) -> bool:
        """Whether a previous-checkpoint location was supplied (not whether an object is there)."""

    @abc.abstractmethod
    async def load(self) -> Path | None:
        """Restore the previous attempt's checkpoint; see :meth:`load_sync`."""

    @abc.abstractmethod
    async def save(self, data: SaveData, *, incremental: bool = False) -> None:
        """Save ``data`` as this attempt's checkpoint; see :meth:`save_sync`."""

    @abc.abstractmethod
    def load_sync(self, *, progress: ProgressCallback | None = None) -> Path | None:
        """Restore the previous attempt's checkpoint, blocking."""

    @abc.abstractmethod
    def save_sync(self, data: SaveData, *, incremental: bool = False) -> None:
        """Save ``data`` as this attempt's checkpoint, blocking; a directory with ``incremental``
        as changed content only (:mod:`flyte_checkpoint.incremental`)."""


class Checkpoint(BaseCheckpoint):
    """A checkpoint stored as one object at ``checkpoint_dest``, restored from ``checkpoint_src``.

    ``save`` accepts bytes, a file path (uploaded as-is) or a directory path (uploaded as one
    ``.tar.gz`` of its immediate children). ``load`` returns ``None`` when there is nothing to
    resume from, :attr:`path` after restoring a directory archive, or ``path / "payload"`` after
    restoring a raw object. The first load fetches; later loads return the same result.

    Use it as a context manager (``with`` or ``async with``) or call :meth:`close` /
    :meth:`aclose` to finish background saves and remove the workspace.

    Every save is atomic: a concurrent or later reader sees the previous complete object or the
    new complete one. Loads verify what they read and raise :class:`CheckpointCorruptError` for
    damaged data and :class:`CheckpointUnavailableError` when storage cannot be reached, so a
    real checkpoint is never mistaken for "no checkpoint".

    Args:
        checkpoint_dest: where this attempt saves (local path, ``file://``, ``s3://``, ...).
        checkpoint_src: the previous attempt's object; whitespace, quotes or ``""`` mean none.
        storage_options: options for the fsspec backend of both URIs (endpoint, credentials...).
        transfer: this package's transfer settings for both URIs (parallelism, part size, time
            bound, local fsync); without it they are read from ``storage_options`` as before.
        compression_level: gzip level for directory archives, 0 (store) to 9.
        extraction_limits: caps on what a directory archive may unpack to.
        repair_prev_uri: apply :func:`repair_prev_checkpoint_uri` to remote sources.
        run_name: the run's name, used by that repair and by the walk back to earlier attempts
            (see :meth:`load_sync`); defaults to the running task's (:func:`ctx`).
        action_name: the action's name, used likewise; defaults to the running task's.
        attempt_number: this attempt's 0-based number, used by that repair; defaults to the
            running task's, else ``FLYTE_ATTEMPT_NUMBER`` (0 when unset).
        retry: how transient storage failures are retried (whole save or load, bounded).
    """

    def __init__(
        self,
        checkpoint_dest: str | os.PathLike[str],
        checkpoint_src: str | os.PathLike[str] | None = None,
        *,
        storage_options: StorageOptions | None = None,
        transfer: TransferSettings | None = None,
        compression_level: int = archive.DEFAULT_COMPRESSION_LEVEL,
        extraction_limits: ExtractionLimits | None = None,
        repair_prev_uri: bool = True,
        run_name: str | None = None,
        action_name: str | None = None,
        attempt_number: int | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not isinstance(checkpoint_dest, str | os.PathLike):
            raise UnsupportedTypeError(
                f"checkpoint_dest must be a str URI or path, got {type(checkpoint_dest).__name__}"
            )
        dest = clean_uri(os.fspath(checkpoint_dest))
        if dest is None:
            raise InvalidCheckpointInputError(
                "checkpoint_dest is empty; pass the URI or path this attempt should save to"
            )
        if not 0 <= compression_level <= 9:
            raise InvalidCheckpointInputError(
                f"compression_level must be 0 (store) to 9, got {compression_level}"
            )
        src = clean_uri(os.fspath(checkpoint_src) if checkpoint_src is not None else None)
        running_now = running.running_attempt()
        if running_now is not None:
            run_name = run_name or running_now.run_name
            action_name = action_name or running_now.action_name
        if attempt_number is None:
            attempt_number = running_now.attempt_number if running_now else attempt_number_from_env()
        if src is not None and not is_local(src) and repair_prev_uri:
            src = repair_prev_checkpoint_uri(
                src, run_name=run_name, action_name=action_name, attempt_number=attempt_number
            )
        for uri in (dest, src):
            if uri is not None:
                check_object_uri(uri)
        self._dest = dest
        self._src = src
        self._attempt_names = (run_name, action_name)
        self._attempt_number = attempt_number
        self._restored_from: RestoredFrom | None = None
        self._storage_options = storage_options
        self._dest_backend = backend_for(dest, storage_options, transfer=transfer)
        self._src_backend: Backend | None = (
            backend_for(src, storage_options, transfer=transfer) if src else None
        )
        self._level = compression_level
        self._limits = extraction_limits or ExtractionLimits()
        self._retry = retry or RetryPolicy()
        self._workspace = Workspace()
        self._load_lock = threading.Lock()
        self._loaded = False
        self._restored: Path | None = None
        self._earlier_uploads_discarded = False
        self._chunk_store = ChunkStore(chunk_store_for(dest, run_name=run_name, action_name=action_name))
        self._saves = SaveScheduler(
            Destination(dest, self._dest_backend, self._retry, compression_level, self._chunk_store)
        )

    # -- locations --------------------------------------------------------------------------

    @property
    def remote_destination(self) -> str:
        """The URI this helper saves to."""
        return self._dest

    @property
    def remote_source(self) -> str | None:
        """The URI this helper restores from, after cleaning and repair; ``None`` if none."""
        return self._src

    def prev_exists(self) -> bool:
        """Whether a previous-checkpoint URI was supplied (the object itself may be absent)."""
        return self._src is not None

    @property
    def last_committed(self) -> datetime.datetime | None:
        """When (UTC) this helper's newest save committed to :attr:`remote_destination`; ``None``
        while none has. A background save counts once it committed."""
        last = self._saves.last_save
        return None if last is None else last.committed_at

    @property
    def path(self) -> Path:
        """The local workspace directory (prefix ``flyte-cp-``), created on first access."""
        return self._workspace.path

    # -- preemption --------------------------------------------------------------------------

    @property
    def preempted(self) -> bool:
        """Whether this process received a preemption notice (SIGTERM, by default).

        Reading it changes nothing about this helper's saves. It does tell the preemption
        handler that this task handles the notice itself: it is no longer ended for you once
        saves are done. The documented loop::

            if checkpoint.preempted:
                checkpoint.hold_background_save()  # the final state is written without it
            if step % 100 == 0 or checkpoint.preempted:
                checkpoint.save_sync(state, background=not checkpoint.preempted)
            if checkpoint.preempted:
                raise checkpoint.preemption()
        """
        notice.take_over()
        return notice.current_notice() is not None

    def hold_background_save(self) -> None:
        """After a preemption notice, hold this helper's background upload in flight while the
        task writes its final state; nothing before a notice.

        The task is about to write its newest state and save it in the foreground, and the older
        upload would only take the cores and the disk from that. The upload stops at its next
        write for up to half the time left before the save deadline, once per notice (calling
        again changes nothing). The next save (which overtakes the held upload, or is refused as
        not fitting, letting it go on at once), :meth:`preemption`, :meth:`wait_sync` or
        :meth:`close` ends the hold; without any, the upload resumes when the hold runs out.
        Like reading :attr:`preempted`, it tells the handler the task handles the notice.
        """
        notice.take_over()
        current = notice.current_notice()
        if current is not None:
            self._saves.take_over(current)

    @property
    def last_save(self) -> SaveTimes | None:
        """What the newest save of this helper that committed cost, or ``None`` before one did.

        Split as torch DCP splits it: :attr:`~SaveTimes.staged_seconds`, how long the call kept
        the task (a background save: its snapshot), and :attr:`~SaveTimes.durable_seconds`, until
        the object committed; :attr:`~SaveTimes.copied_bytes` is what the snapshot had to copy
        instead of hard-linking (files seen rewritten in place, for one).
        """
        return self._saves.last_save

    def time_left(self) -> float | None:
        """Seconds until the expected SIGKILL, or ``None`` before a preemption notice."""
        notice.take_over()
        current = notice.current_notice()
        return None if current is None else current.time_left()

    def preemption(self) -> Preempted:
        """The exception that ends this attempt after a notice: ``raise checkpoint.preemption()``.

        Its message says whether a save of this helper committed after the notice, and where.
        A background save still in flight is waited for first, up to the save deadline: in the
        documented loop a notice that arrives while the state is being written finds the save
        of that step already sent to the background, and whether it commits decides both the
        message and :attr:`Preempted.saved` (which the exit status of ``flyte-checkpoint run`` goes by).
        Raises :class:`RuntimeError` when there was no notice (check :attr:`preempted` first).
        """
        current = notice.current_notice()
        if current is None:
            raise RuntimeError("no preemption notice was received; check checkpoint.preempted first")
        unsettled = self._saves.settle()
        saved = self._saves.durations.committed_since(current.received_at)
        if saved:
            detail = (
                f"the checkpoint saved after the notice committed to {self._dest}; the next "
                "attempt resumes from it"
            )
        elif unsettled is not None:
            detail = f"{unsettled}; the next attempt resumes from the newest checkpoint that committed"
        else:
            detail = (
                f"no save to {self._dest} committed after the notice; the next attempt resumes from "
                "the newest earlier one, if any"
            )
        return notice.preempted_exit(current, detail=detail, saved=saved)

    # -- load --------------------------------------------------------------------------------

    @property
    def restored_from(self) -> RestoredFrom | None:
        """Where the load restored from: the object's ``uri`` and its ``attempt`` directory.

        ``None`` before the first load and when it found nothing to restore. It differs from
        :attr:`remote_source` when the load walked back to an earlier attempt (see
        :meth:`load_sync`).
        """
        return self._restored_from

    def load_sync(self, *, progress: ProgressCallback | None = None) -> Path | None:
        """Restore the previous checkpoint into :attr:`path`; ``None`` when there is none.

        Returns :attr:`path` for a directory archive and ``path / "payload"`` for a raw object.
        The first call clears the workspace and fetches; later calls (from any thread) return the
        cached result without fetching again. Errors are not cached: a failed load can be retried.
        ``progress(bytes_read, object_size)`` is called as the object streams in.

        When the previous checkpoint is absent or empty and its URI lies under a
        per-attempt directory (``…/{run_name}/{action_name}/{n}/…``, names known), the load
        walks back: it restores the newest of up to 16 earlier attempts that saved
        (:mod:`flyte_checkpoint.single.earlier_attempts`), skipping damaged ones with a WARNING, and
        :attr:`restored_from` says which; local paths and ``file://`` URIs in that layout walk
        back too. An attempt after the first that finds nothing says so at WARNING.

        Raises:
            CheckpointCorruptError: the object is damaged (digest, gzip CRC, truncation) or an
                unsafe archive (:class:`UnsafeArchiveError`); nothing is left in the workspace.
            CheckpointUnavailableError: storage could not be reached after bounded retries.
            CheckpointPermissionError: credentials or permissions refused the read.
        """
        self._workspace.ensure_open()
        with self._load_lock:
            if not self._loaded:
                self._restored = self._restore(progress)
                self._loaded = True
                self._open_destination_early()
                self._discard_earlier_uploads()
            if self._restored is None:
                return None
            return self._workspace.keep_alive(self._restored)

    def _open_destination_early(self) -> None:
        """Make the destination store's client ready now, in the background, for the first save.

        A process's first request to a store pays for building its client (botocore loads and
        resolves its service model) and its first connection: 0.16 s here against a loopback
        S3, more over a real network. A task's first save is often the one made at a preemption
        notice, whose grace period that cost came out of. One metadata request on the
        destination, right after the load that starts every task, pays it while time is cheap.
        A failure is only logged: the save that needs the store reports its own.
        """
        if is_local(self._dest):
            return

        def open_destination() -> None:
            try:
                self._dest_backend.info(self._dest)
            except Exception as error:
                logger.debug("could not reach %s ahead of the first save: %s", self._dest, error)

        threading.Thread(
            target=open_destination, name="flyte-checkpoint-open-destination", daemon=True
        ).start()

    def _discard_earlier_uploads(self) -> None:
        """Abort, in the background, what killed saves of earlier attempts left unfinished on
        the store (:func:`~flyte_checkpoint.single.earlier_attempts.discard_earlier_uploads`):
        once per helper, at its first load or save, which is where an attempt starts."""
        if self._earlier_uploads_discarded:
            return
        self._earlier_uploads_discarded = True
        run_name, action_name = self._attempt_names
        discard_earlier_uploads(self._dest_backend, self._dest, run_name=run_name, action_name=action_name)

    async def load(self, *, progress: ProgressCallback | None = None) -> Path | None:
        """Async :meth:`load_sync`: the work runs in a thread, so the event loop never stalls."""
        return await asyncio.to_thread(self.load_sync, progress=progress)

    def _restore(self, progress: ProgressCallback | None) -> Path | None:
        src, backend = self._src, self._src_backend
        if src is None or backend is None:
            return None
        run_name, action_name = self._attempt_names
        candidates = attempt_uris(src, run_name=run_name, action_name=action_name, earlier=MAX_WALK_BACK)

        def load(uri: str) -> Path | None:
            return load_object(
                backend,
                uri,
                self._workspace.path,
                reset=self._workspace.clear,
                limits=self._limits,
                retry=self._retry,
                progress=progress,
            )

        restored = restore_newest(backend, candidates, load, retry=self._retry)
        if restored is None:
            if self._attempt_number > 0:
                # Loud: a retried attempt starting over is work lost, and `flyte-checkpoint run`
                # shows warnings only.
                logger.warning(
                    "attempt %d found no checkpoint to resume from at %s%s; it starts from the beginning",
                    self._attempt_number,
                    src,
                    f" nor at the {len(candidates) - 1} attempts before it" if len(candidates) > 1 else "",
                )
            return None
        path, self._restored_from = restored
        return path

    # -- save --------------------------------------------------------------------------------

    def save_sync(
        self,
        data: SaveData,
        *,
        background: bool = False,
        progress: ProgressCallback | None = None,
        incremental: bool = False,
    ) -> None:
        """Save ``data`` to :attr:`remote_destination`, atomically replacing what was there.

        ``bytes`` become the object; a file path is uploaded as-is; a directory path is uploaded
        as one ``.tar.gz`` of its immediate children, streamed (no temporary archive).

        With ``incremental=True`` a directory is saved as content-addressed chunks, of which
        only those not stored yet by a save of this checkpoint (any attempt) are uploaded, and
        a manifest committed last at :attr:`remote_destination` (see
        :mod:`flyte_checkpoint.incremental`); :meth:`load_sync` restores either kind. The
        reference SDK cannot read a manifest. Bytes and files are saved as one object all the
        same. :meth:`collect_garbage_sync` removes the chunks no checkpoint references any more.

        With ``background=True`` the call returns as soon as a snapshot of ``data`` is taken (hard
        links, no data copied) and the upload runs in a worker thread; later changes to the files
        do not leak into it. At most one background save is in flight; a newer one supersedes a
        queued one. Its failure is raised by the next save, :meth:`wait_sync` or :meth:`close`,
        unless a newer save succeeded after it (the newest state wins; it is logged at WARNING).
        A blocking save first waits for background saves, so saves land in call order. After a
        preemption notice it does not wait: the background upload in flight is paused while
        this one, the newer state, uses the time left; if this one commits, the older one is
        discarded (it can never commit over it), and if it fails the older one goes on.

        ``progress(bytes_written, total)`` is called as the object is written; ``total`` is
        known for bytes and files, ``None`` for a directory (its archive size is not known ahead).

        Raises:
            FileNotFoundError: (:class:`CheckpointNotFoundError`) the path does not exist.
            TypeError: (:class:`UnsupportedTypeError`) ``data`` is not bytes, ``Path`` or ``str``.
            ValueError: (:class:`InvalidCheckpointInputError`) empty data, or a socket, FIFO
                or device, which would not read back as a checkpoint.
        """
        self._workspace.ensure_open()
        content = _validated(data)
        self._refuse_destination_inside(content)
        self._discard_earlier_uploads()
        self._saves.save(content, background=background, progress=progress, incremental=incremental)

    def _refuse_destination_inside(self, content: bytes | Path) -> None:
        """Refuse a directory whose local destination lies inside it: every save would pack the
        previous object (and the save's own temp file) into the next, which grows each time."""
        if isinstance(content, bytes) or not is_local(self._dest) or not content.is_dir():
            return
        source = content.resolve()
        destination = local_path(self._dest).resolve()
        if destination == source or source in destination.parents:
            raise InvalidCheckpointInputError(
                f"cannot save {content} to {self._dest}: the destination is inside the directory "
                "being saved, so each save would store the previous checkpoint in the next; "
                f"save to a location outside {content}"
            )

    async def save(
        self,
        data: SaveData,
        *,
        background: bool = False,
        progress: ProgressCallback | None = None,
        incremental: bool = False,
    ) -> None:
        """Async :meth:`save_sync`: the work runs in a thread, so the event loop never stalls.

        If the awaiting task is cancelled, the save already under way still finishes (or fails)
        atomically in its thread; it is never left half-written.
        """
        await asyncio.to_thread(
            self.save_sync, data, background=background, progress=progress, incremental=incremental
        )

    def collect_garbage_sync(self, *, grace: datetime.timedelta = DEFAULT_GRACE) -> CollectedGarbage:
        """Remove the chunks of incremental saves that no live checkpoint references.

        Live are this helper's destination, its restore source and the same checkpoint of the
        attempts a load would walk back to (16 before each); chunks of a save still in progress
        elsewhere are kept too. A chunk is deleted only by a collection at least ``grace``
        after the one that first found it unreferenced (the rule is explained in
        :mod:`flyte_checkpoint.incremental.gc`). Waits for this helper's background saves first.
        """
        self.wait_sync()
        run_name, action_name = self._attempt_names
        # The source's manifests are read with the destination's store: a source elsewhere
        # cannot share the destination's chunks anyway.
        same_store = self._src is not None and scheme_of(self._src) == scheme_of(self._dest)
        live = [self._dest] + ([self._src] if self._src and same_store else [])
        candidates = [
            candidate.uri
            for uri in live
            for candidate in attempt_uris(
                uri, run_name=run_name, action_name=action_name, earlier=MAX_WALK_BACK
            )
        ]
        return collect_garbage(self._dest_backend, self._chunk_store, dict.fromkeys(candidates), grace=grace)

    async def collect_garbage(self, *, grace: datetime.timedelta = DEFAULT_GRACE) -> CollectedGarbage:
        """Async :meth:`collect_garbage_sync`."""
        return await asyncio.to_thread(self.collect_garbage_sync, grace=grace)

    def wait_sync(self) -> None:
        """Block until background saves are done; raise the failure of the newest that failed.

        A failed save that a newer, successful save overtook is logged at WARNING, not raised.
        After a preemption notice the wait ends at the save deadline (a margin before the
        expected SIGKILL) with :class:`PreemptionDeadlineError`; the upload goes on meanwhile.
        """
        self._saves.wait()

    async def wait(self) -> None:
        """Async :meth:`wait_sync`."""
        await asyncio.to_thread(self.wait_sync)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Finish background saves, then remove the workspace (also removed on garbage collection).

        Raises the failure of a background save, after removing the workspace all the same.
        """
        try:
            self.wait_sync()
        finally:
            self._workspace.close()

    async def aclose(self) -> None:
        """Async :meth:`close`: waiting for background saves and removing the workspace run in a
        thread, so the event loop never stalls."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as failure:
            _attach_close_failure(exc, failure, self._dest)

    async def __aenter__(self) -> Checkpoint:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.__exit__, exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"Checkpoint(checkpoint_dest={self._dest!r}, checkpoint_src={self._src!r})"


def _attach_close_failure(exc: BaseException, failure: Exception, dest: str) -> None:
    """Leaving a ``with`` block by ``exc``: a failure to close (a background save that failed)
    is told beside it, never instead of it, so the task's own error (or its preemption) is the
    one that propagates."""
    logger.error(
        "closing the checkpoint helper of %s failed while another error propagated: %s", dest, failure
    )
    add_context(
        exc,
        f"flyte_checkpoint: closing the checkpoint helper of {dest} also failed: {describe_error(failure)}",
    )
    if exc.__context__ is None:
        exc.__context__ = failure


def _validated(data: SaveData) -> bytes | Path:
    """``data`` as bytes or a path to a regular file or directory, or a clear error."""
    if isinstance(data, bytes | bytearray | memoryview):
        content = bytes(data)
        if not content:
            raise InvalidCheckpointInputError(
                "refusing to save empty bytes: an empty object reads back as 'no checkpoint'; "
                "save at least one byte (e.g. a version marker)"
            )
        return content
    if not isinstance(data, str | os.PathLike):
        raise UnsupportedTypeError(
            f"save() takes bytes, a pathlib.Path or a str path, not {type(data).__name__}"
        )
    if not str(os.fspath(data)).strip():
        raise InvalidCheckpointInputError("save() got an empty path; pass the file or directory to save")
    path = Path(os.fspath(data))
    with translated_os_errors(str(path), "reading"):
        try:
            status = os.stat(path)
        except FileNotFoundError:
            hint = (
                "; save() reads a str as a path: to save the text itself, pass bytes (text.encode())"
                if isinstance(data, str)
                else ""
            )
            raise CheckpointNotFoundError(
                f"cannot save {path}: no such file or directory (checkpoint source path does not exist){hint}"
            ) from None
    if stat.S_ISREG(status.st_mode) and status.st_size == 0:
        raise InvalidCheckpointInputError(
            f"refusing to save {path}: it is empty, and an empty object reads back as 'no checkpoint'"
        )
    if not (stat.S_ISDIR(status.st_mode) or stat.S_ISREG(status.st_mode)):
        raise InvalidCheckpointInputError(
            f"cannot save {path}: it is a {archive.describe_mode(status.st_mode)}, not a regular file "
            "or directory"
        )
    return path
