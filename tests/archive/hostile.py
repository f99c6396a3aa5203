"""Builders for hostile tar and tar.gz archives, made in memory with :mod:`tarfile`.

These helpers only ever *write* archives. Nothing in the test suite extracts them with
``tarfile``: extraction is the code under test.

An archive is described as a list of :data:`Member` values (a header and the bytes that follow
it). Most members come from :mod:`tarfile` headers, so they are well formed at the byte level;
:func:`raw_member` and :func:`declared_only` make the ones a normal writer refuses to produce
(a size that is not followed by data, an extended header that declares a terabyte).
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

BLOCK = tarfile.BLOCKSIZE
"""The tar block size: every header and every data area is a multiple of it."""

END_OF_ARCHIVE = bytes(2 * BLOCK)
"""Two zero blocks, the end-of-archive marker."""


@dataclass(frozen=True)
class Member:
    """One archive entry as bytes: the header block(s), then the data area (padded to a block)."""

    header: bytes
    data: bytes = b""

    def to_bytes(self) -> bytes:
        padding = -len(self.data) % BLOCK
        return self.header + self.data + bytes(padding)


def _info(name: str, kind: bytes, *, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = 1_700_000_000
    return info


Format = Literal[0, 1, 2]
"""``tarfile.USTAR_FORMAT``, ``GNU_FORMAT`` or ``PAX_FORMAT``."""


def _header(
    info: tarfile.TarInfo,
    fmt: Format = tarfile.PAX_FORMAT,
    pax: Mapping[str, str] | None = None,
) -> bytes:
    if pax is not None:
        info.pax_headers = dict(pax)
    return info.tobuf(fmt, "utf-8", "surrogateescape")


def file(
    name: str,
    data: bytes = b"payload",
    *,
    mode: int = 0o644,
    fmt: Format = tarfile.PAX_FORMAT,
    pax: Mapping[str, str] | None = None,
    mtime: int = 1_700_000_000,
) -> Member:
    """A regular file member."""
    info = _info(name, tarfile.REGTYPE, mode=mode, size=len(data))
    info.mtime = mtime
    return Member(_header(info, fmt, pax), data)


def directory(name: str, *, mode: int = 0o755, fmt: Format = tarfile.PAX_FORMAT) -> Member:
    """A directory member."""
    return Member(_header(_info(name, tarfile.DIRTYPE, mode=mode), fmt))


def symlink(
    name: str,
    target: str,
    *,
    fmt: Format = tarfile.PAX_FORMAT,
    pax: Mapping[str, str] | None = None,
) -> Member:
    """A symbolic link member pointing at ``target``."""
    return Member(_header(_info(name, tarfile.SYMTYPE, mode=0o777, linkname=target), fmt, pax))


def hardlink(name: str, target: str, *, fmt: Format = tarfile.PAX_FORMAT) -> Member:
    """A hard link member to the archive path ``target``."""
    return Member(_header(_info(name, tarfile.LNKTYPE, mode=0o644, linkname=target), fmt))


def special(name: str, kind: bytes) -> Member:
    """A device node or FIFO member (``tarfile.CHRTYPE``, ``BLKTYPE`` or ``FIFOTYPE``)."""
    info = _info(name, kind, mode=0o666)
    info.devmajor, info.devminor = 1, 3  # /dev/null
    return Member(_header(info))


def declared_only(name: str, size: int, *, fmt: Format = tarfile.PAX_FORMAT) -> Member:
    """A regular file header that declares ``size`` bytes, with none of them following it."""
    info = _info(name, tarfile.REGTYPE, mode=0o644, size=size)
    return Member(_header(info, fmt))


def raw_member(name: str, kind: bytes, declared_size: int, data: bytes = b"") -> Member:
    """A single header block of any type (including extended headers) with raw data.

    GNU format, so that a declared size beyond 8 GiB is written in base-256.
    """
    info = _info(name, kind, mode=0o644, size=declared_size)
    return Member(info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"), data)


def tar_bytes(members: Iterable[Member], *, end: bytes = END_OF_ARCHIVE) -> bytes:
    """The members as one uncompressed tar stream, followed by ``end``."""
    return b"".join(member.to_bytes() for member in members) + end


def gzipped(data: bytes, *, level: int = 6) -> bytes:
    """``data`` as one gzip member (deterministic: no name, mtime 0)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=level, mtime=0) as writer:
        writer.write(data)
    return out.getvalue()


def tar_gz(members: Iterable[Member], *, end: bytes = END_OF_ARCHIVE) -> bytes:
    """The members as a gzipped tar stream: what a directory checkpoint looks like."""
    return gzipped(tar_bytes(members, end=end))


def zeros_gzip_member(size: int) -> bytes:
    """A gzip member that inflates to ``size`` zero bytes (about 1 KiB per MiB)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    parts = []
    remaining = size
    while remaining:
        step = min(remaining, len(chunk))
        parts.append(compressor.compress(chunk[:step]))
        remaining -= step
    parts.append(compressor.flush())
    return b"".join(parts)


def file_tar_gz(name: str, size: int, pattern: bytes = b"\x00") -> bytes:
    """A gzipped tar of one file of ``size`` bytes repeating ``pattern``, built in 1 MiB steps."""
    info = tarfile.TarInfo(name)
    info.size = size
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = (pattern * ((1 << 20) // len(pattern) + 1))[: 1 << 20]
    parts = [compressor.compress(info.tobuf(tarfile.PAX_FORMAT))]
    remaining = size
    while remaining:
        step = min(remaining, len(chunk))
        parts.append(compressor.compress(chunk[:step]))
        remaining -= step
    parts.append(compressor.compress(bytes(-size % tarfile.BLOCKSIZE) + END_OF_ARCHIVE))
    parts.append(compressor.flush())
    return b"".join(parts)


def symlink_realpath_overflow(component_length: int, steps: str = "abcdefghijklmnop") -> list[Member]:
    """The archive of CVE-2025-4517, adapted from CPython's ``test_realpath_limit_attack``.

    Directories ``d…d/d…d/…`` nest ``len(steps)`` deep and a one-letter symlink at each level
    points at the next directory, so ``a/b/c/…/p`` is short but expands to nearly PATH_MAX. A
    link of 254 characters placed *through* that chain then makes the expanded path longer than
    PATH_MAX: ``os.path.realpath`` gives up on it and continues lexically, so an ``escape`` link
    that climbs out of it looked inside to ``tarfile``'s data filter before the fix. The archive
    then writes a file through ``escape`` and hard-links a file outside.
    """
    component = "d" * component_length
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(directory(os.path.join(path, component), mode=0o777))
        members.append(symlink(os.path.join(path, step), component))
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(symlink(linkpath, os.path.join(*([".."] * len(steps)))))
    members.append(symlink("escape", os.path.join(linkpath, "..")))
    members.append(hardlink("flaglink", os.path.join("escape", "victim")))
    members.append(file("flaglink", b"overwrite"))
    members.append(file("escape/newfile", b"new"))
    return members


def write_many_members_tar_gz(sink: IO[bytes], count: int, *, distinct: bool = False) -> None:
    """Stream a tar.gz of ``count`` empty regular files into ``sink``.

    By default every member is named ``m``, so an extractor that keeps going replaces one file
    over and over: the archive tests member counting, not disk space. With ``distinct`` they are
    ``0000000``, ``0000001``, ...: each one a new file, as in a foreign archive built to make an
    extractor create (and then remove) millions of them. Written block by block (ustar, no
    extended headers), so it costs seconds per million members, not memory.
    """
    header = file("m" if not distinct else "0" * 7, b"", fmt=tarfile.USTAR_FORMAT).header
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    for first in range(0, count, 4096):
        step = min(count - first, 4096)
        batch = (
            [_renamed(header, b"%07d" % number) for number in range(first, first + step)]
            if distinct
            else [header] * step
        )
        sink.write(compressor.compress(b"".join(batch)))
    sink.write(compressor.compress(END_OF_ARCHIVE))
    sink.write(compressor.flush())


def _renamed(header: bytes, name: bytes) -> bytes:
    """The ustar ``header`` with a name of the same length, its checksum redone."""
    block = bytearray(header)
    block[: len(name)] = name
    block[148:156] = b" " * 8  # the checksum field counts as spaces
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


# ---------------------------------------------------------------------------------------------
# Where hostile archives are loaded: a workspace with sentinels beside it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    """A sandbox under pytest's ``tmp_path`` for loading one hostile object.

    ``temp`` is made the process's temporary directory, so the checkpoint workspace
    (``temp/flyte-cp-…``) is created inside it, right beside ``outside`` (a sentinel directory
    holding ``victim``) and ``temp/victim``: a member that climbs one or two levels out of the
    workspace lands on a sentinel. ``source`` is the previous-checkpoint object, written with a
    plain ``open()`` so it carries no recorded format or digest and is sniffed.
    """

    root: Path
    temp: Path
    outside: Path
    source: Path

    @property
    def destination(self) -> str:
        return str(self.root / "destination")

    def write_source(self, data: bytes) -> None:
        with open(self.source, "wb") as out:
            out.write(data)


def make_site(root: Path) -> Site:
    """Create the sandbox directories and sentinels below ``root`` (tempdir is patched by callers)."""
    temp = root / "tmp"
    outside = temp / "outside"
    outside.mkdir(parents=True)
    (outside / "victim").write_bytes(b"original")
    (temp / "victim").write_bytes(b"original")
    objects = root / "objects"
    objects.mkdir()
    return Site(root=root, temp=temp, outside=outside, source=objects / "previous")


Snapshot = dict[str, tuple[str, bytes | str | None, int]]


def snapshot(root: Path, *, skip: Path | None = None) -> Snapshot:
    """Every entry below ``root`` (not following links): kind, content or target, and mode.

    ``skip`` (a workspace) is left out with everything below it, and so is its lock file.
    """
    entries: Snapshot = {}
    skip_lock = skip.with_name(skip.name + ".lock") if skip is not None else None
    for directory, dirnames, filenames in os.walk(root):
        here = Path(directory)
        if skip is not None and here == skip:
            dirnames[:] = []
            continue
        for name in [*dirnames, *filenames]:
            path = here / name
            if skip is not None and path in (skip, skip_lock):
                continue
            status = os.lstat(path)
            relative = path.relative_to(root).as_posix()
            if stat.S_ISLNK(status.st_mode):
                entries[relative] = ("link", os.readlink(path), 0)
            elif stat.S_ISDIR(status.st_mode):
                entries[relative] = ("dir", None, stat.S_IMODE(status.st_mode))
            else:
                entries[relative] = ("file", path.read_bytes(), stat.S_IMODE(status.st_mode))
    return entries
