"""Remove a directory tree of any depth, without following symlinks.

``shutil.rmtree`` before Python 3.13 recurses once per level: a tree deeper than the interpreter's
recursion limit (about 1,000 levels, which a restored archive or a task's scratch can hold) raised
``RecursionError`` from a workspace's clean-up, and from the sweep of abandoned workspaces that
runs when a later task opens its own, failing a task that never saw that tree. This walks with
an explicit stack of directory descriptors instead: no recursion, and no path longer than one
name is ever built, so a tree deeper than ``PATH_MAX`` goes too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(top: str) -> None:
    """Remove ``top`` and everything below it; a missing ``top`` is already removed, a ``top``
    that is a file or a symlink is refused with :class:`NotADirectoryError` (as ``shutil.rmtree``).

    Symlinks are removed, never followed. A directory inside the tree that its owner made
    read-only or unreadable is made accessible (``0o700``) and the step retried; ``top``'s own
    parent is never changed (it is a shared directory such as ``/tmp``). Any other failure
    raises its :class:`OSError`.
    """
    try:
        root = os.open(top, _DIRECTORY_FLAGS)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        # As shutil.rmtree: a file, or a symlink (even to a directory), is not a tree to remove.
        kind = "a symbolic link" if os.path.islink(top) else "not a directory"
        raise NotADirectoryError(errno.ENOTDIR, f"cannot remove a tree at {top}: it is {kind}", top) from None
    # Each frame: a directory's descriptor, its name in the frame below, and the names left.
    stack: list[tuple[int, str, list[str]]] = [(root, top, os.listdir(root))]
    try:
        while stack:
            directory, name, pending = stack[-1]
            if not pending:
                stack.pop()
                os.close(directory)
                if stack:
                    parent = stack[-1][0]
                    _remove_entry(os.rmdir, name, parent)
                continue
            entry = pending.pop()
            try:
                mode = os.stat(entry, dir_fd=directory, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode):
                child = _open_child(directory, entry)
                if child is not None:
                    stack.append((child, entry, os.listdir(child)))
            else:
                _remove_entry(os.unlink, entry, directory)
    finally:
        for directory, _, _ in stack:
            os.close(directory)
    _missing_ok(os.rmdir, top, None)


def _open_child(parent: int, name: str) -> int | None:
    """A descriptor of directory ``name`` in ``parent``, made readable if need be; ``None`` if gone."""
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent)
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)


def _remove_entry(remove: Callable[..., None], name: str, directory: int) -> None:
    """``remove`` entry ``name`` of ``directory``; on ``EACCES`` make ``directory`` writable first."""
    try:
        _missing_ok(remove, name, directory)
    except PermissionError:
        os.fchmod(directory, 0o700)
        _missing_ok(remove, name, directory)


def _missing_ok(remove: Callable[..., None], name: str, directory: int | None) -> None:
    with contextlib.suppress(FileNotFoundError):
        remove(name, dir_fd=directory)
