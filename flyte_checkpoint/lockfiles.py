"""Files that prove their owner is alive: an ``flock`` held for as long as the owner needs them.

The kernel drops a process's locks when it dies, so a lock file nobody holds belongs to a dead
owner, and whatever it guards can be removed. Used for save temp files, restore workspaces and
background-save snapshots, and the scratch directories of state checkpoints and Ray actors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from flyte_checkpoint.tree_removal import remove_tree

LOCK_SUFFIX = ".lock"
SNAPSHOT_PREFIX = ".flyte-cp-snapshot-"
"""Names of background-save snapshots; one may sit beside the saved path (see snapshot.py)."""


def create_locked(path: Path, mode: int = 0o600) -> int | None:
    """Create ``path`` and lock it; the descriptor, or ``None`` if a sweep took it meanwhile.

    Between the file's creation and our lock, a sweep (another thread or process) may find it
    unlocked, take its lock, and remove it with what it guards: our lock then fails, or the file
    is gone once we hold it. Either way the caller tries again with a new name; a sweep holding
    the lock is never an error (it was, 1-2% of the time, with 8 threads making workspaces).
    """
    # Readable too: a local save reads back what the kernel copied into its temp file.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def is_ours(status: os.stat_result, kind: Callable[[int], bool]) -> bool:
    """Whether ``status`` (from ``lstat``/``fstat``) is of ``kind`` and owned by this process's user.

    Lock files sit in shared directories such as ``/tmp``, where any local user can plant one
    with our naming pattern: only what we could have made ourselves is ever removed.
    """
    return kind(status.st_mode) and status.st_uid == os.geteuid()


def remove_if_abandoned(path: Path, remove: Callable[[], bool | None]) -> bool:
    """If no live process holds ``path``'s lock, call ``remove()`` (while holding it) and say so.

    Only a regular file owned by this user counts as a lock (never followed through a symlink).
    ``remove()`` returns ``False`` when it found the guarded files not to be ours and left them.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        status = os.fstat(fd)
        if not is_ours(status, stat.S_ISREG):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.samestat(status, os.lstat(path)):
            return False
        return remove() is not False
    except OSError:
        return False  # held by a live owner, or removed meanwhile
    finally:
        os.close(fd)


def sweep_abandoned(directory: Path, prefix: str) -> int:
    """Remove every ``prefix*`` tree in ``directory`` whose lock file (``*.lock``) nobody holds.

    Trees of other tools with the same prefix have no lock file and are left alone; so is
    anything not made by this user, or a symlink.
    """
    return _sweep_locked(directory, _named(directory, prefix))


def _named(directory: Path, prefix: str) -> list[str]:
    """The names in ``directory`` that start with ``prefix`` (none when it cannot be listed)."""
    try:
        return [name for name in os.listdir(directory) if name.startswith(prefix)]
    except OSError:
        return []


def _sweep_locked(directory: Path, names: list[str]) -> int:
    """:func:`sweep_abandoned` of the lock files among ``names`` (entries of ``directory``)."""
    locks = (directory / name for name in names if name.endswith(LOCK_SUFFIX))
    return sum(remove_if_abandoned(lock, partial(_remove_tree_and_lock, lock)) for lock in locks)


def _remove_tree_and_lock(lock: Path) -> bool:
    if not remove_owned_tree(str(lock)[: -len(LOCK_SUFFIX)]):
        return False
    os.unlink(lock)
    return True


def remove_owned_tree(directory: str) -> bool:
    """Remove ``directory`` if it is a real directory (not a symlink) of this user; say whether.

    A directory missing already counts as removed. Whatever cannot be removed is left behind:
    this runs on close, at garbage collection and in sweeps, where raising helps nobody.
    """
    try:
        status = os.lstat(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not is_ours(status, stat.S_ISDIR):
        return False
    # A task may have made a directory of its tree read-only: remove_tree makes it writable.
    with contextlib.suppress(OSError):
        remove_tree(directory)
    return not os.path.lexists(directory)


def is_snapshot_scratch(path: str) -> bool:
    """Whether ``path`` is a background-save snapshot of ours (live or abandoned) or its lock file.

    Checked by every walk of a directory being saved: a snapshot placed beside a source (when
    TMPDIR is on another filesystem) must never become a member of a later save of that
    directory. Only entries we made count: the prefix, and a lock file of this user beside it.
    """
    name = os.path.basename(path)
    if not name.startswith(SNAPSHOT_PREFIX):
        return False
    lock = path if name.endswith(LOCK_SUFFIX) else path + LOCK_SUFFIX
    try:
        return is_ours(os.lstat(lock), stat.S_ISREG)
    except OSError:
        return False


def make_locked_directory(parent: Path, prefix: str) -> tuple[Path, int]:
    """A new directory ``prefix*`` in ``parent`` and the descriptor of its held lock file.

    First removes the ``prefix*`` directories of ``parent`` whose process died holding them
    (:func:`sweep_abandoned`), so each new one clears what killed processes left;
    :func:`release_locked_directory` removes this one while its process lives. The lock file is
    made before the directory (and removed after it): a process killed between the two leaves a
    lock file nobody holds, which the next sweep removes. The other order (of earlier versions)
    left, now and then, an empty directory without a lock that no sweep found; those are
    removed here too (:func:`_sweep_lockless_empty`).
    """
    names = _named(parent, prefix)  # one listing for both sweeps: a load makes a workspace
    _sweep_locked(parent, names)
    _sweep_lockless_empty(parent, prefix, names)
    while True:
        directory = parent / f"{prefix}{os.urandom(6).hex()}"
        lock = Path(str(directory) + LOCK_SUFFIX)
        try:
            fd = create_locked(lock)
        except FileExistsError:
            continue  # the name is taken: draw another
        if fd is None:
            continue
        try:
            os.mkdir(directory, 0o700)
        except BaseException as exc:  # a full TMPDIR, say: leave no lock file behind either
            with contextlib.suppress(OSError):
                os.unlink(lock)
            os.close(fd)
            if isinstance(exc, FileExistsError):
                continue
            raise
        return directory, fd


LOCKLESS_AGE = 60.0
"""Seconds an empty directory without a lock file must have existed to be removed: a process of
an earlier version makes its directory a moment before its lock file."""

_EARLIER_NAME = re.compile(r"[a-z0-9_]{8}")
"""What followed the prefix in the names earlier versions drew (``tempfile.mkdtemp``'s)."""


def _sweep_lockless_empty(parent: Path, prefix: str, names: list[str]) -> None:
    """Remove the empty directories of this user among ``names`` (entries of ``parent``) named
    as earlier versions of :func:`make_locked_directory` named them (``prefix`` and eight of
    ``mkdtemp``'s characters) that have no lock file and are older than :data:`LOCKLESS_AGE`.
    Nothing else: ``rmdir`` removes only empty directories, and any other ``prefix*`` name is
    another tool's."""
    listed = set(names)
    now = time.time()
    for name in names:
        if not _EARLIER_NAME.fullmatch(name[len(prefix) :]) or name + LOCK_SUFFIX in listed:
            continue
        directory = parent / name
        with contextlib.suppress(OSError):
            status = os.lstat(directory)
            if is_ours(status, stat.S_ISDIR) and now - status.st_mtime > LOCKLESS_AGE:
                os.rmdir(directory)


def release_locked_directory(directory: str, lock_fd: int) -> None:
    """Remove a directory of :func:`make_locked_directory` with its lock file, then drop the lock."""
    try:
        remove_owned_tree(directory)
        with contextlib.suppress(OSError):
            os.unlink(directory + LOCK_SUFFIX)
    finally:
        os.close(lock_fd)


@contextlib.contextmanager
def locked_scratch_directory(prefix: str) -> Iterator[Path]:
    """A scratch directory ``prefix*`` in ``TMPDIR`` for the ``with`` block, removed after it.

    Unlike :class:`tempfile.TemporaryDirectory`, one left by a process killed inside the block
    (SIGKILL, the OOM killer) is removed by the next call with the same prefix, in any process.
    """
    directory, lock_fd = make_locked_directory(Path(tempfile.gettempdir()), prefix)
    try:
        yield directory
    finally:
        release_locked_directory(str(directory), lock_fd)
