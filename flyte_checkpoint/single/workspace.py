"""The local directory a checkpoint is restored into, and its lifetime."""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path, PosixPath

from flyte_checkpoint.errors import CheckpointClosedError
from flyte_checkpoint.lockfiles import make_locked_directory, release_locked_directory, sweep_abandoned
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.tree_removal import remove_tree

WORKSPACE_PREFIX = "flyte-cp-"


def sweep_abandoned_workspaces(temp_dir: str | None = None) -> int:
    """Remove workspaces whose process died without cleaning up; return how many.

    Every workspace has a lock file beside it (``flyte-cp-XXXX.lock``), held with ``flock`` for
    the workspace's lifetime; the kernel drops the lock when the process dies, so a workspace
    whose lock can be taken was abandoned (a SIGKILLed load, say). Workspaces of other tools with
    the same prefix have no lock file and are left alone (a new workspace also removes the empty,
    lockless ones earlier versions could leave: see ``make_locked_directory``).
    """
    return sweep_abandoned(Path(temp_dir or tempfile.gettempdir()), WORKSPACE_PREFIX)


def _create_locked_workspace() -> tuple[Path, int]:
    """A new workspace directory and the descriptor holding its lock (abandoned ones swept)."""
    temp_dir = tempfile.gettempdir()
    with translated_os_errors(temp_dir, "creating a checkpoint workspace (TMPDIR) in"):
        return make_locked_directory(Path(temp_dir), WORKSPACE_PREFIX)


class Workspace:
    """A temporary directory (prefix ``flyte-cp-``), made on first use and removed on close or GC.

    Paths handed to callers are :class:`WorkspacePath` objects that keep the workspace alive, so
    ``Checkpoint(...).load_sync()`` returns a path that still exists after the helper itself is
    garbage-collected.
    """

    def __init__(self) -> None:
        self._directory: Path | None = None
        self._finalizer: weakref.finalize[[str, int], Workspace] | None = None
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
            self._directory, lock_fd = _create_locked_workspace()
            self._finalizer = weakref.finalize(self, release_locked_directory, str(self._directory), lock_fd)
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
        with translated_os_errors(str(root), "clearing the workspace"), os.scandir(root) as children:
            for child in children:
                if child.is_dir(follow_symlinks=False):
                    remove_tree(child.path)
                else:
                    os.unlink(child.path)

    def close(self) -> None:
        """Remove the directory now; idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()


class WorkspacePath(PosixPath):
    """A path inside a checkpoint workspace that keeps the workspace from being removed."""

    _workspace: Workspace | None = None

    def __reduce__(self) -> tuple[type[Path], tuple[str]]:
        # Pickles (e.g. to a worker process) as a plain path: the keep-alive is local.
        return (Path, (str(self),))
