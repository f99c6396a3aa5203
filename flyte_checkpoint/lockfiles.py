"""Files that prove their owner is alive: an ``flock`` held for as long as the owner needs them.

The kernel drops a process's locks when it dies, so a lock file nobody holds belongs to a dead
owner, and whatever it guards can be removed. Used for save temp files and restore workspaces.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path


def create_locked(path: Path, mode: int = 0o600) -> int | None:
    """Create ``path`` and lock it; the descriptor, or ``None`` if a sweep took it meanwhile.

    A sweep may lock and unlink the file between its creation and our lock; the caller then
    tries again with a new name.
    """
    # Readable too: a local save reads back what the kernel copied into its temp file.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def remove_if_abandoned(path: Path, remove: Callable[[], None]) -> bool:
    """If no live process holds ``path``'s lock, call ``remove()`` (while holding it) and say so."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.samestat(os.fstat(fd), os.lstat(path)):
            return False
        remove()
        return True
    except OSError:
        return False  # held by a live owner, or removed meanwhile
    finally:
        os.close(fd)
