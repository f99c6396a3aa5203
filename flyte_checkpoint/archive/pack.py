"""Writing: a directory tarred and compressed straight into a writable stream."""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from flyte_checkpoint.archive.compression import CHUNK, DEFAULT_COMPRESSION_LEVEL, gzip_writer
from flyte_checkpoint.archive.links import link_resolution_problem, link_target_problem
from flyte_checkpoint.errors import InvalidCheckpointInputError


def pack_directory(source: Path, sink: IO[bytes], *, level: int = DEFAULT_COMPRESSION_LEVEL) -> None:
    """Write ``source``'s immediate children, recursively, as a ``.tar.gz`` stream into ``sink``.

    Symbolic links that stay inside ``source`` are stored as links (absolute targets made
    relative); a link leaving it (checked the way :func:`unpack_archive` checks it, so what saves
    also loads), a socket, a FIFO or a device node is refused before anything is written,
    because the archive could not be restored faithfully.
    """
    alias, entries = check_tree(source)  # the whole tree is validated before the first byte goes out
    with (
        gzip_writer(sink, level) as compressed,
        tarfile.open(fileobj=compressed, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar,
    ):
        tar.copybufsize = CHUNK  # type: ignore[attr-defined]  # undocumented, 16 KiB default
        for path, arcname in entries:
            _add_entry(tar, path, arcname, alias)


def check_tree(source: Path) -> tuple[tuple[str, str], list[tuple[Path, str]]]:
    """Validate a directory for saving: every entry (below its real path) with its archive name.

    Also returns ``(path as given, real path)``: absolute links may name the tree through the
    path the caller gave, itself perhaps a link. Raises :class:`InvalidCheckpointInputError`
    naming the first entry that could not be restored faithfully (a link leaving the tree, a
    socket, a FIFO, a device node).
    """
    root = Path(os.path.realpath(source))
    alias = (str(Path(source).absolute()), str(root))
    return alias, list(_walk(root, alias))


def _walk(root: Path, alias: tuple[str, str]) -> Iterator[tuple[Path, str]]:
    """Every entry below ``root`` in a stable order, with its archive name; refuses what can't be stored."""
    pending = [root]
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as scan:
            children = sorted(scan, key=lambda entry: entry.name)
        for entry in children:
            path = Path(entry.path)
            arcname = path.relative_to(root).as_posix()
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                _check_link_stays_inside(root, path, arcname, alias)
            elif stat.S_ISDIR(mode):
                pending.append(path)
            elif not stat.S_ISREG(mode):
                raise InvalidCheckpointInputError(
                    f"cannot save {path}: it is a {describe_mode(mode)}, which a checkpoint "
                    "cannot hold; remove it from the directory or save a directory without it"
                )
            yield path, arcname


def _stored_link_target(link: Path, alias: tuple[str, str]) -> str:
    """The target a symbolic link is archived with: relative, so the tree points at itself."""
    target = os.readlink(link)
    if os.path.isabs(target):
        given, real = alias
        if target == given or target.startswith(given.rstrip(os.sep) + os.sep):
            target = real + target[len(given) :]
        return os.path.relpath(target, os.path.dirname(link))
    return target


def _check_link_stays_inside(root: Path, link: Path, arcname: str, alias: tuple[str, str]) -> None:
    target = os.readlink(link)
    stored = _stored_link_target(link, alias)
    where = "the directory being saved"
    problem = link_target_problem(arcname, stored, where) or link_resolution_problem(
        str(root), arcname, stored, where
    )
    if problem is not None:
        raise InvalidCheckpointInputError(
            f"cannot save {link}: it is a symbolic link to {target!r}, {problem}, so it could not "
            "be restored; copy the target into the directory or remove the link"
        )


def _add_entry(tar: tarfile.TarFile, path: Path, arcname: str, alias: tuple[str, str]) -> None:
    info = tar.gettarinfo(str(path), arcname)
    if info.issym():
        info.linkname = _stored_link_target(path, alias)
    if info.isreg():
        with open(path, "rb") as content:
            tar.addfile(info, content)
    else:
        tar.addfile(info)


def describe_mode(mode: int) -> str:
    """A human name for a non-regular file mode (socket, FIFO, device node)."""
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    return "special file"
