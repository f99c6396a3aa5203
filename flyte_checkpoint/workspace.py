"""The local directory a checkpoint is restored into, and its lifetime."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path, PosixPath

from flyte_checkpoint.errors import CheckpointClosedError

WORKSPACE_PREFIX = "flyte-cp-"


class Workspace:
    """A temporary directory (prefix ``flyte-cp-``), made on first use and removed on close or GC.

    Paths handed to callers are :class:`WorkspacePath` objects that keep the workspace alive, so
    ``Checkpoint(...).load_sync()`` returns a path that still exists after the helper itself is
    garbage-collected.
    """

    def __init__(self) -> None:
        self._directory: Path | None = None
        self._finalizer: weakref.finalize[[str], Workspace] | None = None
        self._closed = False

    def ensure_open(self) -> None:
        """Raise :class:`CheckpointClosedError` if the workspace was closed."""
        if self._closed:
            raise CheckpointClosedError(
                "this checkpoint helper was closed and its workspace removed; create a new "
                "Checkpoint to load or save again"
            )

    @property
    def path(self) -> WorkspacePath:
        """The directory, created if it does not exist yet."""
        self.ensure_open()
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix=WORKSPACE_PREFIX))
            self._finalizer = weakref.finalize(self, _remove_tree, str(self._directory))
        self._directory.mkdir(parents=True, exist_ok=True)
        return self.keep_alive(self._directory)

    def keep_alive(self, path: Path) -> WorkspacePath:
        """``path`` as a :class:`WorkspacePath` that holds this workspace open."""
        alive = WorkspacePath(path)
        alive._workspace = self
        return alive

    def clear(self) -> None:
        """Remove everything inside the directory, keeping the directory."""
        root = self.path
        for child in os.scandir(root):
            if child.is_dir(follow_symlinks=False):
                shutil.rmtree(child.path)
            else:
                os.unlink(child.path)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Remove the directory now; idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()


def _remove_tree(directory: str) -> None:
    # Restored trees are made owner-writable on extraction, but a task may have chmod'ed a
    # directory since: make it writable and retry rather than leave the workspace behind.
    def make_writable_and_retry(function: Callable[[str], object], path: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            function(path)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=make_writable_and_retry)
    else:
        shutil.rmtree(directory, onerror=make_writable_and_retry)


class WorkspacePath(PosixPath):
    """A path inside a checkpoint workspace that keeps the workspace from being removed."""

    _workspace: Workspace | None = None

    def __reduce__(self) -> tuple[type[Path], tuple[str]]:
        # Pickles (e.g. to a worker process) as a plain path: the keep-alive is local.
        return (Path, (str(self),))
