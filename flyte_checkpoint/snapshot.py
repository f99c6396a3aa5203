"""Cheap, consistent snapshots of save inputs, so a background save is isolated from later writes.

A directory is snapshotted as a tree of hard links (one ``link()`` per file, no data copied) on
the same filesystem; a later ``write-new-then-rename``, a delete or a new file in the source does
not reach the snapshot. An in-place overwrite of a file *does* reach it (the inode is shared), so
every snapshot file's size and mtime are recorded and checked again after the upload has
read it: a change fails that save before it commits, rather than storing a mix of two states.
Where hard links are impossible (another filesystem, a filesystem without them) the files are
copied instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from flyte_checkpoint.archive import check_tree, describe_mode
from flyte_checkpoint.errors import InputChangedError, InvalidCheckpointInputError
from flyte_checkpoint.progress import ProgressCallback

_Stamp = tuple[int, int]


@dataclass
class Snapshot:
    """A frozen view of what a save will upload: bytes, or a path private to this save."""

    data: bytes | Path
    owned_root: Path | None = None
    stamps: dict[str, _Stamp] = field(default_factory=dict)
    progress: ProgressCallback | None = None
    gate: threading.Event | None = None
    """Set while the upload may write; cleared while the caller takes the next snapshot."""

    def verify_unchanged(self) -> None:
        """Raise :class:`InputChangedError` if any snapshot file changed since it was taken."""
        for path, stamp in self.stamps.items():
            try:
                now = _stamp(os.lstat(path))
            except FileNotFoundError:
                now = (-1, -1)
            if now != stamp:
                raise InputChangedError(
                    f"{os.path.basename(path)} was modified in place while a background save was "
                    "uploading it, so that save was discarded and the previous checkpoint kept; write "
                    "new files and rename them (as torch.save to a new name does) or wait() before "
                    "rewriting"
                )

    def discard(self) -> None:
        """Remove the private copy, if this snapshot made one."""
        if self.owned_root is not None:
            shutil.rmtree(self.owned_root, ignore_errors=True)
            self.owned_root = None


def _stamp(status: os.stat_result) -> _Stamp:
    # Not ctime: unlinking or renaming over the *source* name changes the shared inode's ctime,
    # and those are exactly the writes a snapshot isolates.
    return (status.st_size, status.st_mtime_ns)


def take_snapshot(data: bytes | Path, scratch: Path) -> Snapshot:
    """Snapshot ``data``; hard links go below ``scratch`` or, failing that, beside the source."""
    if isinstance(data, bytes):
        return Snapshot(data)
    mode = os.stat(data).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise InvalidCheckpointInputError(
            f"cannot save {data}: it is a {describe_mode(mode)}, not a regular file or directory"
        )
    if stat.S_ISDIR(mode):
        check_tree(data)  # refuse what cannot be saved now, naming the caller's paths
    for parent in (scratch, data.parent):
        root = parent / f".flyte-cp-snapshot-{uuid.uuid4().hex}"
        try:
            root.mkdir()
        except OSError:
            continue
        snapshot = Snapshot(root / data.name, owned_root=root)
        try:
            _mirror(data, root / data.name, snapshot, link=True)
            return snapshot
        except OSError as exc:
            snapshot.discard()
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                raise
    root = scratch / f".flyte-cp-snapshot-{uuid.uuid4().hex}"
    root.mkdir()
    snapshot = Snapshot(root / data.name, owned_root=root)
    try:
        _mirror(data, root / data.name, snapshot, link=False)
    except BaseException:
        snapshot.discard()
        raise
    return snapshot


def _mirror(source: Path, target: Path, snapshot: Snapshot, *, link: bool) -> None:
    if stat.S_ISREG(os.stat(source).st_mode):
        _place_file(source, target, snapshot, link=link)
        return
    # Plain string paths and one scandir per directory: with pathlib and os.walk, path objects
    # cost as much as the links themselves, and a background save's caller waits for all of it.
    pending = [(str(source), str(target))]
    while pending:
        directory, mirrored = pending.pop()
        os.mkdir(mirrored)
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            destination = os.path.join(mirrored, entry.name)
            if entry.is_symlink():
                os.symlink(_link_target(Path(entry.path), source), destination)
            elif entry.is_dir(follow_symlinks=False):
                pending.append((entry.path, destination))
            elif entry.is_file(follow_symlinks=False):
                _place_file(entry.path, destination, snapshot, link=link)
            else:
                mode = entry.stat(follow_symlinks=False).st_mode
                raise InvalidCheckpointInputError(
                    f"cannot save {entry.path}: it is a {describe_mode(mode)}, which a checkpoint cannot hold"
                )
        with contextlib.suppress(OSError):
            shutil.copystat(directory, mirrored, follow_symlinks=False)


def _link_target(link: Path, source: Path) -> str:
    """A link's target, made relative when it is absolute but inside the tree being saved."""
    target = os.readlink(link)
    if not os.path.isabs(target):
        return target
    for prefix in {str(source.absolute()), os.path.realpath(source)}:
        if target == prefix or target.startswith(prefix.rstrip(os.sep) + os.sep):
            real_target = os.path.realpath(source) + target[len(prefix) :]
            return os.path.relpath(real_target, os.path.realpath(link.parent))
    return target


def _place_file(source: str | Path, target: str | Path, snapshot: Snapshot, *, link: bool) -> None:
    if link:
        os.link(source, target, follow_symlinks=False)
        snapshot.stamps[os.fspath(target)] = _stamp(os.lstat(target))
    else:
        shutil.copy2(source, target, follow_symlinks=False)
