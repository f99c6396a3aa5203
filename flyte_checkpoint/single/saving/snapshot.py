"""Cheap, consistent snapshots of save inputs, so a background save is isolated from later writes.

A directory is snapshotted as hard links (one ``link()`` per file, no data copied) on the same
filesystem, taken flat and given their tree once the caller has gone on
(:meth:`Snapshot.complete`); a later ``write-new-then-rename``, a delete or a new file in the
source does not reach the snapshot. An in-place overwrite of a file *does* reach it (the inode
is shared), so every linked file's size and mtime are recorded and checked again after the
upload has read it: a change fails that save before it commits, rather than storing a mix of
two states.

Writes through a shared writable memory map (``np.memmap``, ``torch.from_file(shared=True)``)
move the mtime only when a clean page is first dirtied, so the check above cannot see them:
files mapped shared-writable by this process or another of this user's processes (their
``/proc/<pid>/maps``) are copied into the snapshot instead of linked. Where hard links are
impossible (another filesystem, a filesystem without them) every file is copied.

Each snapshot directory (``.flyte-cp-snapshot-*``) has a lock file beside it, held for its
lifetime like a workspace's: the next snapshot sweeps those a killed process left behind, and
no walk of a directory being saved ever packs one (:func:`~flyte_checkpoint.lockfiles.is_snapshot_scratch`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from flyte_checkpoint.archive import TreeEntry, describe_mode, walk_tree
from flyte_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    CheckpointStorageError,
    InputChangedError,
    InvalidCheckpointInputError,
)
from flyte_checkpoint.lockfiles import (
    LOCK_SUFFIX,
    SNAPSHOT_PREFIX,
    create_locked,
    remove_owned_tree,
    sweep_abandoned,
)
from flyte_checkpoint.storage.errors import os_error_to_checkpoint_error

_Stamp = tuple[int, int]
_FileId = tuple[int, int]

_STAGING_SUFFIX = ".staged"

_rewritten_in_place: set[_FileId] = set()
"""The files (device, inode) seen rewritten in place under a snapshot's hard link (as
``torch.save(state, same_path)`` does: same inode, truncated): later snapshots copy them, so the
pattern costs a copy per save instead of every save that overlaps the next write."""


@dataclass
class _Layout:
    """The tree a directory snapshot still has to be given: its files are linked flat into
    ``staging`` so far (see :meth:`Snapshot.complete`)."""

    staging: str
    directories: list[tuple[str, os.stat_result]] = field(default_factory=list)
    """Each directory to make, parents first, with the status of the one it mirrors."""
    files: list[tuple[str, str]] = field(default_factory=list)
    """Each file as staged, and where it goes."""
    symlinks: list[tuple[str, str]] = field(default_factory=list)
    """Each symbolic link to make, and its target."""


@dataclass
class Snapshot:
    """A frozen view of what a save will upload: bytes, or a path private to this save.

    It owns that private path (removed by :meth:`discard`); what the save does with it (its
    progress, its place in the commit order) is the :class:`~flyte_checkpoint.single.saving.job.SaveJob`'s.
    """

    data: bytes | Path
    owned_root: Path | None = None
    source: Path | None = None
    """The caller's path that ``data`` is a snapshot of; ``None`` when ``data`` is that path."""
    stamps: dict[str, _Stamp] = field(default_factory=dict)
    lock_fd: int | None = None
    layout: _Layout | None = None
    """What :meth:`complete` still has to do before ``data`` can be read."""
    copied_bytes: int = 0
    """Bytes this snapshot copied instead of linking (files rewritten in place before, mapped
    shared-writable, or on a filesystem without hard links): the cost a background save's caller
    waits for beyond the links."""

    @property
    def user_path(self) -> Path | None:
        """The path the caller asked to save (never the snapshot's), or ``None`` for bytes."""
        if self.source is not None:
            return self.source
        return self.data if isinstance(self.data, Path) else None

    def complete(self) -> None:
        """Give a directory snapshot its tree, off the caller's thread, before it is read.

        The caller of a background save waits only for the hard links, taken flat into one
        staging directory: one ``mkdir`` per directory of the tree cost it more than all the
        links (95 directories of a 128 MiB model: 5-20 ms, the links 4 ms). Here the directories
        are made, the links moved into place and the symbolic links made; each directory then
        gets the mode and times recorded when the snapshot was taken (deepest first, once
        everything is in it: a read-only directory refuses new entries). Nothing here reads the
        caller's tree, so what it changed since the snapshot does not reach this one.
        """
        layout, self.layout = self.layout, None
        if layout is None:
            return
        try:
            for directory, _ in layout.directories:
                os.mkdir(directory)
            for staged, placed in layout.files:
                os.rename(staged, placed)
            for placed, target in layout.symlinks:
                os.symlink(target, placed)
            os.rmdir(layout.staging)
            for directory, status in reversed(layout.directories):
                os.chmod(directory, stat.S_IMODE(status.st_mode))
                os.utime(directory, ns=(status.st_atime_ns, status.st_mtime_ns))
        except OSError as exc:
            # The staged names mean nothing to the caller: name their path, and the directory
            # the snapshot is in (TMPDIR, or beside their path), where the error happened.
            parent = self.owned_root.parent if self.owned_root is not None else None
            where = f"{self.user_path} (its background save's snapshot in {parent})"
            raise os_error_to_checkpoint_error(exc, where, "saving") from exc

    def verify_unchanged(self) -> None:
        """Raise :class:`InputChangedError` if any linked file changed since it was taken.

        Every linked file is checked, not only up to the first change: a step usually rewrites
        several files in place (``weights.bin`` and ``meta.json`` alike), and each one learnt
        here is copied by later snapshots, so one discarded save teaches them all instead of
        one discarded save per file.
        """
        changed: list[str] = []
        for path, stamp in self.stamps.items():
            try:
                status: os.stat_result | None = os.lstat(path)
            except FileNotFoundError:
                status = None
            if status is None or _stamp(status) != stamp:
                if status is not None:  # the link's inode is the caller's file
                    _rewritten_in_place.add((status.st_dev, status.st_ino))
                changed.append(path)
        if changed:
            others = f" (and {len(changed) - 1} other files)" if len(changed) > 1 else ""
            raise InputChangedError(
                f"{self._user_name(changed[0])}{others} was modified in place while a background "
                "save was uploading it, so that save was discarded and the previous checkpoint kept; "
                "later saves copy such files instead of linking them; write new files and rename "
                "them (as torch.save to a new name does) or wait() before rewriting to avoid the copy"
            )

    @contextlib.contextmanager
    def errors_for_the_caller(self) -> Iterator[None]:
        """Raise OS errors from reading the input as typed errors naming the caller's paths.

        A read that fails because a linked file shrank under it (a short read, or the archive
        writer noticing the size it was told is gone) is the input changing: it raises
        :class:`InputChangedError` naming the caller's file.
        """
        try:
            yield
        except (OSError, EOFError, InputChangedError) as exc:
            if self.user_path is None:
                raise
            try:
                self.verify_unchanged()
            except InputChangedError as changed:
                # Named after the caller's file, whichever check noticed the change first.
                raise changed from (None if isinstance(exc, InputChangedError) else exc)
            if isinstance(exc, CheckpointError) or not isinstance(exc, OSError):
                raise
            raise _source_error(exc, self._user_name(exc.filename)) from exc

    def _user_name(self, path: object) -> str:
        """``path`` with the snapshot's location replaced by the caller's."""
        user = self.user_path
        if not isinstance(path, str) or user is None:
            return str(user)
        if self.source is not None and isinstance(self.data, Path):
            private = str(self.data)
            if path == private or path.startswith(private + os.sep):
                return str(self.source) + path[len(private) :]
        return path

    def discard(self) -> None:
        """Remove the private copy and its lock file, if this snapshot made them."""
        if self.owned_root is not None:
            remove_owned_tree(str(self.owned_root))
            with contextlib.suppress(OSError):
                os.unlink(str(self.owned_root) + LOCK_SUFFIX)
            self.owned_root = None
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


def _stamp(status: os.stat_result) -> _Stamp:
    # Not ctime: unlinking or renaming over the *source* name changes the shared inode's ctime,
    # and those are exactly the writes a snapshot isolates.
    return (status.st_size, status.st_mtime_ns)


def _source_error(exc: OSError, path: str) -> CheckpointError:
    """The typed error for ``exc``, raised while reading ``path`` (the caller's) to save it."""
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        return CheckpointPermissionError(
            f"cannot read {path} to save it: permission denied; make it readable by this process "
            "(e.g. chmod u+r) or move it out of what is saved"
        )
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidCheckpointInputError(
            f"cannot save {path}: a path inside it is longer than the system allows (PATH_MAX); "
            "flatten the directory tree or shorten its names"
        )
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return CheckpointStorageError(
            f"cannot save {path}: too many open files ({exc.strerror}); raise the limit "
            "(ulimit -n) or close files the process keeps open, then save again"
        )
    if isinstance(exc, FileNotFoundError):
        return CheckpointNotFoundError(
            f"cannot save {path}: it disappeared while it was being read (deleted by another "
            "writer?); save again once the directory is complete"
        )
    return os_error_to_checkpoint_error(exc, path, "saving")


def take_snapshot(data: bytes | Path, scratch: Path) -> Snapshot:
    """Snapshot ``data``; hard links go below ``scratch`` or, failing that, beside the source.

    Abandoned snapshots of killed processes in both places are swept first. Errors name the
    caller's paths (see :meth:`Snapshot.errors_for_the_caller`).
    """
    if isinstance(data, bytes):
        return Snapshot(data)
    with Snapshot(data).errors_for_the_caller():
        return _take_path_snapshot(data, scratch)


def _take_path_snapshot(data: Path, scratch: Path) -> Snapshot:
    status = os.stat(data)
    mode = status.st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise InvalidCheckpointInputError(
            f"cannot save {data}: it is a {describe_mode(mode)}, not a regular file or directory"
        )
    # The one walk of the tree, before anything is linked: it refuses what cannot be saved,
    # naming the caller's paths, and its errors (an unreadable directory) are the caller's,
    # never taken for a filesystem without hard links.
    entries = list(walk_tree(data)) if stat.S_ISDIR(mode) else []
    for place in (scratch, data.parent):  # where a killed save may have left a snapshot
        with contextlib.suppress(OSError):
            sweep_abandoned(place, SNAPSHOT_PREFIX)
    mapped = _shared_writable_mappings()
    for parent in (scratch, data.parent):
        snapshot = _new_snapshot(data, parent)
        if snapshot is None:
            continue
        try:
            _mirror(data, status, entries, snapshot, mapped, link=True)
            return snapshot
        except BaseException as exc:
            snapshot.discard()
            links_impossible = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES)
            if not isinstance(exc, OSError) or exc.errno not in links_impossible:
                raise
    snapshot = _new_snapshot(data, scratch, strict=True)
    assert snapshot is not None
    try:
        _mirror(data, status, entries, snapshot, mapped, link=False)
    except BaseException:
        snapshot.discard()
        raise
    return snapshot


def _new_snapshot(data: Path, parent: Path, *, strict: bool = False) -> Snapshot | None:
    """An empty, locked snapshot directory in ``parent``; ``None`` if it cannot be made there."""
    try:
        while True:
            root = parent / f"{SNAPSHOT_PREFIX}{uuid.uuid4().hex}"
            lock_fd = create_locked(Path(str(root) + LOCK_SUFFIX))
            if lock_fd is not None:
                break
        # Named as the caller's path resolves ("." by its directory's name): an empty name
        # would make the snapshot's root its tree.
        name = os.path.basename(os.path.abspath(data)) or "root"
        snapshot = Snapshot(root / name, owned_root=root, source=data, lock_fd=lock_fd)
    except OSError:
        if strict:
            raise
        return None
    try:
        root.mkdir()
    except OSError:
        snapshot.discard()
        if strict:
            raise
        return None
    return snapshot


def _mirror(
    source: Path,
    status: os.stat_result,
    entries: Sequence[TreeEntry],
    snapshot: Snapshot,
    mapped: _Mappings,
    *,
    link: bool,
) -> None:
    """Link (or copy) ``source`` (whose ``stat`` is ``status``) into ``snapshot``: a file, or the
    directory whose :func:`~flyte_checkpoint.archive.walk_tree` is ``entries``."""
    target = snapshot.data
    assert isinstance(target, Path)
    if stat.S_ISREG(status.st_mode):
        file_id = (status.st_dev, status.st_ino)
        _place_file(str(source), str(target), str(target), snapshot, mapped, file_id, link=link)
        return
    # The caller waits only for the walk and the links, taken flat into one staging directory
    # inside the snapshot: the tree of directories they go into is made by
    # :meth:`Snapshot.complete`, off the caller's thread.
    layout = _Layout(staging=str(target) + _STAGING_SUFFIX)
    os.mkdir(layout.staging)
    snapshot.layout = layout
    layout.directories.append((str(target), status))
    for kind, path, name, entry_status, link_target in entries:
        destination = os.path.join(target, name)
        if kind == "directory":
            layout.directories.append((destination, entry_status))
        elif kind == "symlink":
            layout.symlinks.append((destination, link_target))
        else:
            staged = os.path.join(layout.staging, str(len(layout.files)))
            file_id = (entry_status.st_dev, entry_status.st_ino)
            _place_file(path, staged, destination, snapshot, mapped, file_id, link=link)
            layout.files.append((staged, destination))


def _place_file(
    source: str,
    target: str,
    placed: str,
    snapshot: Snapshot,
    mapped: _Mappings,
    file_id: _FileId,
    *,
    link: bool,
) -> None:
    """Link (or copy) ``source`` to ``target``, the path that becomes ``placed`` in the tree."""
    if link and not mapped.holds(source, file_id) and file_id not in _rewritten_in_place:
        os.link(source, target, follow_symlinks=False)
        snapshot.stamps[placed] = _stamp(os.lstat(target))
    else:
        # A true copy: what a shared mapping writes later cannot reach it, and the kernel copies
        # (copy_file_range/sendfile) from the page cache, dirty mapped pages included.
        shutil.copy2(source, target, follow_symlinks=False)
        snapshot.copied_bytes += os.lstat(target).st_size


# /proc/<pid>/maps: "start-end perms offset major:minor inode   path"
_SHARED_WRITABLE = re.compile(rb"^\S+ .w.s \S+ ([0-9a-f]+):([0-9a-f]+) (\d+) +(.*)$", re.MULTILINE)


@dataclass
class _Mappings:
    """Files mapped shared and writable, by (device, inode) and by path (overlayfs reports the
    inode of the layer below in ``maps``, so the path is compared too)."""

    ids: set[_FileId] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)

    names: set[str] = field(default_factory=set)

    def holds(self, path: str, file_id: _FileId) -> bool:
        if file_id in self.ids:
            return True
        return os.path.basename(path) in self.names and os.path.realpath(path) in self.paths


def _shared_writable_mappings() -> _Mappings:
    """Files that this process or another process of this user maps shared and writable.

    Only what ``/proc/<pid>/maps`` shows: processes of other users (whose maps we may not read)
    and mappings made after this call are not seen; README "Background saves" says so.
    """
    mappings = _Mappings()
    user = os.geteuid()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        pids = []
    for pid in ["self", *pids]:
        try:
            if pid != "self" and os.stat(f"/proc/{pid}").st_uid != user:
                continue
            with open(f"/proc/{pid}/maps", "rb") as maps:
                listing = maps.read()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if b"w-s " not in listing and b"wxs " not in listing:
            continue  # most processes map nothing shared-writable: skip the line-by-line parse
        for major, minor, inode, path in _SHARED_WRITABLE.findall(listing):
            mappings.ids.add((os.makedev(int(major, 16), int(minor, 16)), int(inode)))
            mapped_path = os.fsdecode(path.removesuffix(b" (deleted)"))
            mappings.paths.add(mapped_path)
            mappings.names.add(os.path.basename(mapped_path))
    return mappings
