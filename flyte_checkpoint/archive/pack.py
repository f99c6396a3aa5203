"""Writing: a directory tarred and compressed straight into a writable stream."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from flyte_checkpoint.archive.compression import DEFAULT_COMPRESSION_LEVEL, gzip_writer
from flyte_checkpoint.archive.links import link_resolution_problem, link_target_problem
from flyte_checkpoint.archive.tar_writer import TarWriter
from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.lockfiles import SNAPSHOT_PREFIX, is_snapshot_scratch


def pack_directory(
    source: Path, sink: IO[bytes], *, level: int = DEFAULT_COMPRESSION_LEVEL, threads: int | None = None
) -> None:
    """Write ``source``'s immediate children, recursively, as a ``.tar.gz`` stream into ``sink``.

    Symbolic links that stay inside ``source`` are stored as links (absolute targets made
    relative); a link leaving it (checked the way :func:`unpack_archive` checks it, so what saves
    also loads), a socket, a FIFO or a device node raises :class:`InvalidCheckpointInputError`,
    because the archive could not be restored faithfully. The tree is walked once, as it is
    written, keeping nothing per file: a refusal mid-way leaves a partial stream in ``sink``,
    which the caller's atomic writer then discards (see :func:`walk_tree` to refuse up front).
    ``threads`` compress (default: :func:`~.compression.compression_threads`). ``sink.write()``
    must not keep what it is given once it returns (the contract of :mod:`io`'s writers): the
    buffers it is given are reused.
    """
    root = os.path.realpath(source)
    alias = (str(Path(source).absolute()), root)
    with gzip_writer(sink, level, threads) as compressed:
        tar = TarWriter(compressed)
        for kind, path, arcname, status, link in _walk(root, alias):
            if kind == "file":
                tar.add_file(arcname, path, status)
            elif kind == "directory":
                tar.add_directory(arcname, status)
            else:
                tar.add_symlink(arcname, status, link)
        tar.close()


def content_size(source: Path) -> int:
    """Bytes of file content a save of ``source`` packs (what its archive records), from one
    walk of ``stat`` calls; refuses what :func:`walk_tree` refuses."""
    return sum(status.st_size for kind, _, _, status, _ in walk_tree(source) if kind == "file")


_Kind = Literal["file", "directory", "symlink"]

TreeEntry = tuple[_Kind, str, str, os.stat_result, str]
"""One entry of :func:`walk_tree`: kind, path, name relative to the tree, lstat, stored link target."""


def walk_tree(source: Path) -> Iterator[TreeEntry]:
    """Every entry a save of ``source`` holds, in the archive's order: kind, path, name relative
    to ``source``, lstat, stored link target.

    Raises :class:`InvalidCheckpointInputError`, without anything written, naming the first
    entry that could not be restored faithfully (a link leaving the tree, a socket, a FIFO, a
    device node): walked to its end, it refuses a directory that cannot be saved.
    """
    root = os.path.realpath(source)
    return _walk(root, (str(Path(source).absolute()), root))


def _walk(root: str, alias: tuple[str, str]) -> Iterator[TreeEntry]:
    """Every entry below ``root`` in a stable order: kind, path, archive name, lstat, link target.

    Depth first with plain strings: memory is one directory's listing per level, not the tree.
    ``alias`` is ``(path as given, real path)``: absolute links may name the tree through the
    path the caller gave, itself perhaps a link.
    """
    pending = [(root, "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as scan:
            children = sorted(scan, key=lambda entry: entry.name)
        for entry in children:
            if entry.name.startswith(SNAPSHOT_PREFIX) and is_snapshot_scratch(entry.path):
                continue  # a background save's snapshot placed beside a source: never a member
            arcname = prefix + entry.name
            status = entry.stat(follow_symlinks=False)
            mode = status.st_mode
            if stat.S_ISREG(mode):
                yield "file", entry.path, arcname, status, ""
            elif stat.S_ISDIR(mode):
                yield "directory", entry.path, arcname, status, ""
                pending.append((entry.path, arcname + "/"))
            elif stat.S_ISLNK(mode):
                link = _check_link_stays_inside(root, entry.path, arcname, alias)
                yield "symlink", entry.path, arcname, status, link
            else:
                raise InvalidCheckpointInputError(
                    f"cannot save {entry.path}: it is a {describe_mode(mode)}, which a checkpoint "
                    "cannot hold; remove it from the directory or save a directory without it"
                )


def _stored_link_target(link: str, alias: tuple[str, str]) -> str:
    """The target a symbolic link is archived with: relative, so the tree points at itself."""
    target = os.readlink(link)
    if os.path.isabs(target):
        given, real = alias
        if target == given or target.startswith(given.rstrip(os.sep) + os.sep):
            target = real + target[len(given) :]
        return os.path.relpath(target, os.path.dirname(link))
    return target


def _check_link_stays_inside(root: str, link: str, arcname: str, alias: tuple[str, str]) -> str:
    """The target ``link`` is stored with, or :class:`InvalidCheckpointInputError` if it leaves."""
    target = os.readlink(link)
    stored = _stored_link_target(link, alias)
    where = "the directory being saved"
    problem = link_target_problem(arcname, stored, where)
    if problem is not None and stored != target:  # an absolute target, made relative to be stored
        problem = f"an absolute path outside {where}"
    problem = problem or link_resolution_problem(root, arcname, stored, where)
    if problem is not None:
        raise InvalidCheckpointInputError(
            f"cannot save {link}: it is a symbolic link to {target!r}, {problem}, so it could not "
            "be restored; copy the target into the directory or remove the link"
        )
    return stored


def describe_mode(mode: int) -> str:
    """A human name for a non-regular file mode (directory, socket, FIFO, device node)."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    return "special file"
