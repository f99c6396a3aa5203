"""The directory archive format: a streaming ``.tar.gz`` writer and a safe streaming reader.

This module knows byte streams only, never storage. A directory is tarred and compressed straight
into a writable stream, and an archive is unpacked straight from a readable stream: there is no
temporary archive and nothing is held whole in memory.

Extraction does not trust the archive. It follows the ``data`` filter rules of PEP 706 with its
own code, so that it behaves the same on every supported Python (the standard library's filter
had escapes fixed only in late patch releases): no absolute names, no ``..``, no device or FIFO
nodes, no setuid/setgid/sticky bits, hard links only to files already extracted, and symbolic
links created only after every file has been written, then checked, all together, to resolve
inside the tree.

The tar stream is parsed by this module too (ustar, PAX and GNU long-name headers), not by
:mod:`tarfile`, whose reader differs between Python versions in ways a hostile archive can use:
before 3.11.10/3.12.6 its PAX parser takes quadratic time on crafted records (CVE-2024-6232),
before 3.13 it keeps every member header of a stream in memory, it buffers an extended header of
whatever size the header declares, and it takes a damaged or missing header after the first
for the end of the archive. Here every header must carry a valid checksum, extended headers are
capped, and a stream that ends before its end-of-archive block is a truncated one.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import math
import os
import posixpath
import re
import stat
import struct
import tarfile
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from flyte_checkpoint.errors import (
    ArchiveLimitError,
    CheckpointCorruptError,
    CheckpointError,
    InvalidCheckpointInputError,
    UnsafeArchiveError,
)
from flyte_checkpoint.lockfiles import SNAPSHOT_PREFIX, is_snapshot_scratch

_isal_gzip: Any
try:  # python-isal's igzip is 5-10x faster than zlib; fall back to the standard library.
    from isal import igzip_threaded as _isal_gzip
    from isal.isal_zlib import error as _isal_error

    _ISAL_ERRORS: tuple[type[BaseException], ...] = (cast(type[BaseException], _isal_error),)
except ImportError:  # pragma: no cover - exercised only where isal has no wheel
    _isal_gzip = None
    _ISAL_ERRORS = ()

HAVE_ISAL = _isal_gzip is not None

ObjectKind = Literal["archive", "payload"]

DEFAULT_COMPRESSION_LEVEL = 1
_CHUNK = 1 << 20
_TAR_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_TAR_BLOCK)
# Errors that mean "the bytes are not a valid archive", as opposed to failures of the stream.
_FORMAT_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    *_ISAL_ERRORS,
)

_MAX_EXTENDED_HEADER = 1 << 20
"""The most bytes of PAX / GNU long-name headers one member may carry (paths are < 4 KiB)."""
_MAX_LINK_FOLLOWS = 40
"""Links followed while checking one symbolic link, as many as Linux follows (MAXSYMLINKS)."""
_MAX_RESOLVE_STEPS = 4096
"""Path components walked while checking one symbolic link; a longer walk is refused."""


class ExtractionLimits(BaseModel):
    """Caps that stop a hostile or runaway archive from filling the disk."""

    model_config = ConfigDict(frozen=True)

    max_members: int = Field(default=1_000_000, gt=0)
    """The most entries (files, directories, links) an archive may hold."""
    max_total_bytes: int = Field(default=1 << 40, gt=0)
    """The most bytes of file content an archive may unpack to (default 1 TiB)."""


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gzip_writer(sink: IO[bytes], level: int) -> Iterator[IO[bytes]]:
    """A gzip stream over ``sink``; ``level`` 0 stores, 1 is fastest, 9 compresses most.

    With python-isal installed, levels 1-9 use its threaded igzip (compression runs beside the
    caller's reads); level 0 and the fallback use the standard library.
    """
    if not 0 <= level <= 9:
        raise ValueError(f"compression level must be 0 (store) to 9, got {level}")
    writer: IO[bytes]
    if level and _isal_gzip is not None:
        # ISA-L knows levels 0-3; spread zlib's 1-9 over them.
        # threads=2: compression on one thread, hashing and writing the output on another; the
        # benchmark measured directory saves 25% faster with a core free, no slower without.
        writer = _isal_gzip.open(sink, "wb", compresslevel=(level + 2) // 3, threads=2)
    else:
        writer = cast(IO[bytes], gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=level, mtime=0))
    try:
        yield writer
    finally:
        writer.close()


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
        tarfile.open(fileobj=compressed, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_CHUNK) as tar,
    ):
        tar.copybufsize = _CHUNK  # type: ignore[attr-defined]  # undocumented, 16 KiB default
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
            if entry.name.startswith(SNAPSHOT_PREFIX) and is_snapshot_scratch(entry.path):
                continue  # a background save's snapshot placed beside a source: never a member
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
    problem = _link_target_problem(arcname, stored, where)
    if problem is not None and stored != target:  # an absolute target, made relative to be stored
        problem = f"an absolute path outside {where}"
    problem = problem or _link_resolution_problem(str(root), arcname, stored, where)
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


# ---------------------------------------------------------------------------------------------
# Symbolic links: the one check used on save and on load
# ---------------------------------------------------------------------------------------------


def _link_target_problem(name: str, target: str, where: str) -> str | None:
    """What is wrong with ``target`` for a link named ``name``, judged from the text alone."""
    if not target:
        return "an empty target"
    if "\x00" in target:
        return "a target with a NUL byte"
    if target.startswith("/"):
        return f"an absolute path, outside {where}"
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        return f"which climbs with '..' outside {where}"
    return None


def _link_resolution_problem(root: str, name: str, target: str, where: str) -> str | None:
    """Follow ``target`` from the link ``name`` through the tree at ``root`` as the kernel would.

    Returns why it leaves ``root`` (or cannot be checked), or ``None`` when it stays inside.
    Components that do not exist are taken lexically (as directories someone may create later),
    so a dangling link passes only if it would stay inside whatever is created under it. Unlike
    ``os.path.realpath``, this never gives up and continues lexically on an error, and it is the
    same code on every Python version.
    """
    stack = name.split("/")[:-1]  # the link's own directory: real directories, made by us
    real = len(stack)  # how many leading components of ``stack`` exist as directories
    pending = deque(target.split("/"))
    follows = steps = 0
    while pending:
        steps += 1
        if steps > _MAX_RESOLVE_STEPS:
            return f"which takes over {_MAX_RESOLVE_STEPS} steps to follow: too many to check it stays inside"
        part = pending.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return f"which resolves outside {where}"
            stack.pop()
            real = min(real, len(stack))
            continue
        stack.append(part)
        if real < len(stack) - 1:
            continue  # below something that does not exist (or is a file): lexical from here
        path = os.path.join(root, *stack)
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            return f"which cannot be followed to check it stays inside {where} ({exc.strerror})"
        if stat.S_ISLNK(mode):
            follows += 1
            if follows > _MAX_LINK_FOLLOWS:
                return (
                    f"which is a loop or a chain of over {_MAX_LINK_FOLLOWS} links, unusable inside {where}"
                )
            link_target = os.readlink(path)
            stack.pop()
            if link_target.startswith("/"):
                return f"which goes through a link to an absolute path, outside {where}"
            pending.extendleft(reversed(link_target.split("/")))
        elif stat.S_ISDIR(mode):
            real = len(stack)
    return None


# ---------------------------------------------------------------------------------------------
# Tar headers
# ---------------------------------------------------------------------------------------------

_FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_PAX_TYPES = frozenset({tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE})
_LONG_TYPES = frozenset({tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK})
_USTAR_MAGIC = b"ustar\x00"
_PAX_SIZE = re.compile(r"[0-9]{1,20}")
_PAX_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,3})?")
_MTIME_RANGE = 1 << 34  # about year 2514 either side of 1970; anything further is damage


@dataclass
class _Header:
    """One parsed 512-byte header block."""

    name: str
    mode: int
    size: int
    mtime: float
    type: bytes
    linkname: str


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes, what: str, offset: int) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256, for values that octal cannot hold
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    digits = field.split(b"\x00", 1)[0].strip()
    if not digits:
        return 0
    if digits.strip(b"01234567"):
        raise CheckpointCorruptError(f"damaged tar header at byte {offset}: its {what} field is not a number")
    return int(digits, 8)


def _parse_header(block: bytes, offset: int) -> _Header:
    """Decode a non-zero header block; a checksum mismatch or bad number is corruption."""
    stored = _number(block[148:156], "checksum", offset)
    unsigned = 256 + sum(block[:148]) + sum(block[156:])
    signed = 256 + sum(struct.unpack_from("148b8x356b", block))
    if stored not in (unsigned, signed):
        raise CheckpointCorruptError(f"damaged tar header at byte {offset}: its checksum does not match")
    name = _text(block[0:100])
    kind = block[156:157]
    if block[257:263] == _USTAR_MAGIC and kind not in _LONG_TYPES:
        prefix = _text(block[345:500])
        if prefix:
            name = f"{prefix}/{name}"
    if kind == tarfile.AREGTYPE and name.endswith("/"):  # old V7 style directory
        kind = tarfile.DIRTYPE
    return _Header(
        name=name,
        mode=_number(block[100:108], "mode", offset),
        size=_number(block[124:136], "size", offset),
        mtime=_number(block[136:148], "mtime", offset),
        type=kind,
        linkname=_text(block[157:257]),
    )


def _pax_records(data: bytes, header: str, offset: int) -> dict[str, str]:
    """Parse ``"<length> <key>=<value>\\n"`` records in linear time; anything else is corruption."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        if not data[position:].strip(b"\x00"):
            break  # zero padding after the last record
        space = data.find(b" ", position, position + 21)
        digits = data[position:space] if space > position else b""
        end = position + int(digits) if digits.isdigit() else -1
        if not space + 2 < end <= len(data) or data[end - 1] != 0x0A:
            raise CheckpointCorruptError(
                f"archive member {header!r} at byte {offset} is a malformed extended (PAX) header"
            )
        key, equals, value = data[space + 1 : end - 1].partition(b"=")
        if not equals or not key:
            raise CheckpointCorruptError(
                f"archive member {header!r} at byte {offset} is a malformed extended (PAX) header"
            )
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position = end
    return records


@dataclass
class _Entry:
    """One archive member, with its extended headers applied."""

    name: str
    type: bytes
    mode: int
    size: int
    mtime: float
    linkname: str
    offset: int
    sparse: bool = False

    def describe(self) -> str:
        if self.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            return "device node"
        if self.type == tarfile.FIFOTYPE:
            return "FIFO (named pipe)"
        if self.sparse or self.type == tarfile.GNUTYPE_SPARSE:
            return "sparse file, which is not supported"
        return f"member of tar type {self.type!r}"


class _TarReader:
    """Reads tar members from a stream, one at a time, with their data on demand."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.position = 0
        self._global: dict[str, str] = {}
        self._global_bytes = 0
        self._data_left = 0
        self._padding = 0
        self._current: _Entry | None = None

    def _read(self, size: int) -> bytes:
        data = self._stream.read(size)
        if len(data) < size and data:
            parts = [data]
            got = len(data)
            while got < size and (more := self._stream.read(size - got)):
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        self.position += len(data)
        return data

    def _truncated(self, what: str) -> CheckpointCorruptError:
        return CheckpointCorruptError(f"archive is truncated at byte {self.position}: {what}")

    def _skip(self, size: int) -> None:
        while size:
            chunk = self._read(min(size, _CHUNK))
            if not chunk:
                raise self._truncated("it ends inside a member's data")
            size -= len(chunk)

    def read_data(self, size: int) -> bytes:
        """Up to ``size`` bytes of the current member's data; ``b""`` once it is all read."""
        size = min(size, self._data_left)
        if not size:
            return b""
        data = self._read(size)
        if len(data) < size:
            name = self._current.name if self._current else "?"
            raise self._truncated(f"member {name!r} ends early")
        self._data_left -= len(data)
        return data

    def _extended(self, header: _Header, offset: int, used: int) -> bytes:
        if header.size < 0 or used + header.size > _MAX_EXTENDED_HEADER:
            raise ArchiveLimitError(
                f"archive member {header.name!r} at byte {offset} is an extended header of "
                f"{header.size} bytes; more than {_MAX_EXTENDED_HEADER} bytes of them per member "
                "is not a genuine archive"
            )
        data = self._read(header.size)
        if len(data) < header.size:
            raise self._truncated(f"extended header {header.name!r} ends early")
        self._skip(-header.size % _TAR_BLOCK)
        return data

    def next(self) -> _Entry | None:
        """The next member, or ``None`` at the end-of-archive block."""
        self._skip(self._data_left + self._padding)
        self._data_left = self._padding = 0
        pax: dict[str, str] = {}
        long_name: str | None = None
        long_link: str | None = None
        start = self.position
        used = 0
        while True:
            offset = self.position
            block = self._read(_TAR_BLOCK)
            if len(block) < _TAR_BLOCK:
                raise self._truncated("it ends before the end-of-archive marker")
            if block == _ZERO_BLOCK:
                if pax or long_name is not None or long_link is not None:
                    raise CheckpointCorruptError(
                        f"archive is damaged at byte {offset}: an extended header is followed by no member"
                    )
                return None
            header = _parse_header(block, offset)
            if header.type in _PAX_TYPES:
                data = self._extended(header, offset, used)
                used += len(data)
                pax.update(_pax_records(data, header.name, offset))
            elif header.type == tarfile.XGLTYPE:
                data = self._extended(header, offset, self._global_bytes)
                self._global_bytes += len(data)
                self._global.update(_pax_records(data, header.name, offset))
            elif header.type in _LONG_TYPES:
                data = self._extended(header, offset, used)
                used += len(data)
                if header.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = _text(data)
                else:
                    long_link = _text(data)
            else:
                break
        fields = {**self._global, **pax}
        entry = _Entry(
            name=fields.get("path", long_name if long_name is not None else header.name),
            type=header.type,
            mode=header.mode & 0o7777,
            size=header.size,
            mtime=header.mtime,
            linkname=fields.get("linkpath", long_link if long_link is not None else header.linkname),
            offset=start,
            sparse=any(key.startswith("GNU.sparse.") for key in fields),
        )
        if "size" in fields:
            if not _PAX_SIZE.fullmatch(fields["size"]):
                raise CheckpointCorruptError(
                    f"archive member {entry.name!r} declares an invalid size {fields['size']!r}"
                )
            entry.size = int(fields["size"])
        if "mtime" in fields:
            if not _PAX_NUMBER.fullmatch(fields["mtime"]):
                raise CheckpointCorruptError(
                    f"archive member {entry.name!r} has an invalid modification time {fields['mtime']!r}"
                )
            entry.mtime = float(fields["mtime"])
        if entry.size < 0:
            raise CheckpointCorruptError(f"archive member {entry.name!r} declares a negative size")
        if not (math.isfinite(entry.mtime) and -_MTIME_RANGE < entry.mtime < _MTIME_RANGE):
            raise CheckpointCorruptError(
                f"archive member {entry.name!r} has a modification time out of range ({entry.mtime})"
            )
        # Only regular files (and types we refuse anyway) carry data; like tar, ignore the size
        # declared by links and directories.
        has_data = entry.type not in (
            tarfile.DIRTYPE,
            tarfile.SYMTYPE,
            tarfile.LNKTYPE,
            tarfile.CHRTYPE,
            tarfile.BLKTYPE,
            tarfile.FIFOTYPE,
        )
        self._data_left = entry.size if has_data else 0
        self._padding = -self._data_left % _TAR_BLOCK
        self._current = entry
        return entry


# ---------------------------------------------------------------------------------------------
# Sniffing
# ---------------------------------------------------------------------------------------------

SNIFF_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


def sniff_kind(head: bytes) -> tuple[ObjectKind, bool]:
    """Guess from an object's first bytes whether it is a tar archive, and whether it is gzipped.

    Used only for objects that carry no recorded format (written by other tools or by the
    reference SDK): a gzip stream whose first block is a tar header, or a plain tar, is an
    archive; anything else is a payload.

    A gzip stream that cannot be inflated, or that stops before its first block, is reported as
    a (gzipped) archive so that unpacking it raises :class:`CheckpointCorruptError`: a damaged
    directory checkpoint must not be restored as if it were a raw payload. So is a first block
    that keeps the ``ustar`` magic but fails its checksum.
    """
    if head.startswith(_GZIP_MAGIC):
        inflater = zlib.decompressobj(wbits=31)
        try:
            first = inflater.decompress(head, 2 * _TAR_BLOCK)
        except zlib.error:
            return "archive", True
        if _looks_like_tar(first) or first[257:262] == b"ustar":
            return "archive", True
        if len(first) < 2 * _TAR_BLOCK and not inflater.eof:
            return "archive", True  # the stream stops early: truncated
        return "payload", False
    return ("archive", False) if _looks_like_tar(head) else ("payload", False)


def _looks_like_tar(head: bytes) -> bool:
    if len(head) < _TAR_BLOCK:
        return False
    block = head[:_TAR_BLOCK]
    if block == _ZERO_BLOCK:
        # An empty archive is two zero blocks; a directory with no children saves as one.
        return head[: 2 * _TAR_BLOCK] == bytes(2 * _TAR_BLOCK)
    try:
        _parse_header(block, 0)
    except CheckpointCorruptError:
        return False
    return True


class PrefixedReader(io.RawIOBase):
    """A readable stream that yields ``head`` and then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._head.nbytes:
            count = min(len(view), self._head.nbytes)
            view[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gzip_reader(source: IO[bytes]) -> Iterator[IO[bytes]]:
    """A decompressing stream over ``source`` (threaded igzip where available)."""
    reader: IO[bytes]
    if _isal_gzip is not None:
        reader = _isal_gzip.open(source, "rb", threads=1)
    else:
        reader = cast(IO[bytes], gzip.GzipFile(fileobj=source, mode="rb"))
    try:
        yield reader
    finally:
        reader.close()


def unpack_archive(
    source: IO[bytes],
    dest: Path,
    *,
    compressed: bool = True,
    limits: ExtractionLimits | None = None,
) -> None:
    """Extract the tar stream ``source`` (gzipped when ``compressed``) into the directory ``dest``.

    Reads ``source`` to its very end, so the gzip CRC and length are checked after the last
    member. Raises :class:`CheckpointCorruptError` for a damaged stream (including one that ends
    before its end-of-archive block), :class:`UnsafeArchiveError` for a member that would leave
    ``dest`` or may not be restored, and :class:`ArchiveLimitError` past ``limits``; on error,
    what was extracted so far stays in ``dest`` for the caller to remove.
    """
    limits = limits or ExtractionLimits()
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    try:
        if compressed:
            with gzip_reader(source) as plain:
                _Extractor(root, limits).run(plain)
                _drain(plain)
        else:
            _Extractor(root, limits).run(source)
            _drain(source)
    except CheckpointError:
        raise
    except _FORMAT_ERRORS as exc:
        raise CheckpointCorruptError(f"damaged archive: {exc}") from exc


MemberKind = Literal["file", "directory", "symlink", "hardlink", "other"]


class MemberInfo(BaseModel):
    """One member of a directory archive, as listed without extracting it."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: MemberKind
    size: int
    mode: int
    mtime: float
    link: str | None = None


_KINDS: dict[bytes, MemberKind] = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.CONTTYPE: "file",
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}


def list_members(source: IO[bytes], *, compressed: bool = True) -> list[MemberInfo]:
    """The members of the tar stream ``source``, read to its end (so its checks run) unextracted.

    Raises :class:`CheckpointCorruptError` for a damaged stream, like :func:`unpack_archive`.
    """
    members: list[MemberInfo] = []

    def collect(stream: IO[bytes]) -> None:
        reader = _TarReader(stream)
        while (entry := reader.next()) is not None:
            kind: MemberKind = _KINDS.get(entry.type, "other")
            members.append(
                MemberInfo(
                    name=entry.name,
                    kind=kind,
                    size=entry.size if kind == "file" else 0,
                    mode=entry.mode,
                    mtime=entry.mtime,
                    link=entry.linkname if kind in ("symlink", "hardlink") else None,
                )
            )
        _drain(stream)

    try:
        if compressed:
            with gzip_reader(source) as plain:
                collect(plain)
        else:
            collect(source)
    except CheckpointError:
        raise
    except _FORMAT_ERRORS as exc:
        raise CheckpointCorruptError(f"damaged archive: {exc}") from exc
    return members


def _drain(stream: IO[bytes]) -> None:
    while stream.read(_CHUNK):
        pass


# OS errors caused by what a member is called rather than by the disk: the archive cannot be
# restored here, so they are reported as such, naming the member.
_NAME_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EILSEQ})


class _Extractor:
    """Writes the members of one tar stream below ``root``, refusing anything unsafe."""

    def __init__(self, root: Path, limits: ExtractionLimits) -> None:
        self.root = root
        self.limits = limits
        self.members = 0
        self.content_bytes = 0
        self.files: set[str] = set()
        self.directory_modes: list[tuple[Path, int]] = []
        self.symlinks: list[tuple[str, str, str]] = []

    def run(self, stream: IO[bytes]) -> None:
        reader = _TarReader(stream)
        while (entry := reader.next()) is not None:
            self._count(entry)
            try:
                self._extract(reader, entry)
            except OSError as exc:
                if exc.errno not in _NAME_ERRNOS:
                    raise
                raise CheckpointCorruptError(
                    f"archive member {entry.name!r} cannot be restored here: {exc.strerror}"
                ) from exc
        for name, target, raw in self.symlinks:
            self._make_symlink(name, target, raw)
        # Checked only now that every link exists: one link's target may run through another
        # that comes later in the archive.
        for name, target, raw in self.symlinks:
            problem = _link_resolution_problem(str(self.root), name, target, "the workspace")
            if problem is not None:
                raise UnsafeArchiveError(
                    f"archive member {raw!r} is a symbolic link to {target!r}, {problem}"
                )
        for directory, mode in reversed(self.directory_modes):
            os.chmod(directory, mode)

    def _extract(self, reader: _TarReader, entry: _Entry) -> None:
        name = self._safe_name(entry.name, entry)
        if entry.sparse:
            raise UnsafeArchiveError(f"archive member {entry.name!r} is a {entry.describe()}")
        if entry.type == tarfile.DIRTYPE:
            self._make_directory(name, entry)
        elif entry.type in _FILE_TYPES:
            self._write_file(reader, entry, name)
        elif entry.type == tarfile.SYMTYPE:
            self._defer_symlink(entry, name)
        elif entry.type == tarfile.LNKTYPE:
            self._make_hardlink(entry, name)
        else:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a {entry.describe()}; only files, "
                "directories and links are restored"
            )

    def _count(self, entry: _Entry) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise ArchiveLimitError(
                f"archive holds more than {self.limits.max_members} members (member "
                f"{entry.name!r} is one too many); raise ExtractionLimits.max_members if this "
                "checkpoint is genuine"
            )
        if entry.type in _FILE_TYPES:
            self.content_bytes += entry.size
            if self.content_bytes > self.limits.max_total_bytes:
                raise ArchiveLimitError(
                    f"archive unpacks to more than {self.limits.max_total_bytes} bytes (member "
                    f"{entry.name!r} declares {entry.size}); raise "
                    "ExtractionLimits.max_total_bytes if this checkpoint is genuine"
                )

    def _safe_name(self, raw: str, entry: _Entry, role: str = "") -> str:
        """``raw`` normalised (no ``.`` or empty parts), or refused; ``role`` names a link target."""
        subject = f"archive member {entry.name!r}" + (f" {role} {raw!r}, which" if role else "")
        if "\x00" in raw:
            raise UnsafeArchiveError(f"{subject} contains a NUL byte")
        if raw.startswith("/"):
            raise UnsafeArchiveError(f"{subject} {'is' if role else 'has'} an absolute path")
        # On POSIX a backslash or a drive letter is an ordinary character of a file name.
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchiveError(f"{subject} climbs out of the workspace with '..'")
        if not parts:
            return "."
        return "/".join(parts)

    def _path(self, name: str, entry: _Entry) -> Path:
        """The destination of ``name``, after checking no existing parent is a link or a file."""
        current = self.root
        parents = name.split("/")[:-1] if name != "." else []
        for part in parents:
            current = current / part
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                os.mkdir(current, 0o700)
                continue
            if not stat.S_ISDIR(mode):
                raise UnsafeArchiveError(
                    f"archive member {entry.name!r} would be written through "
                    f"{current.relative_to(self.root)!s}, which is not a directory"
                )
        return self.root / name if name != "." else self.root

    def _make_directory(self, name: str, entry: _Entry) -> None:
        path = self._path(name, entry)
        try:
            existing = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        else:
            if not stat.S_ISDIR(existing):
                raise UnsafeArchiveError(f"archive member {entry.name!r} replaces a file by a directory")
        # Applied last, so a read-only directory does not block writing its children.
        self.directory_modes.append((path, (entry.mode & 0o755) | 0o700))

    def _write_file(self, reader: _TarReader, entry: _Entry, name: str) -> None:
        path = self._path(name, entry)
        self._replace_allowed(path, entry)
        self.files.discard(name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            while chunk := reader.read_data(_CHUNK):
                out.write(chunk)
            out.flush()
            os.fchmod(fd, _file_mode(entry.mode))
            os.utime(fd, (entry.mtime, entry.mtime))
        self.files.add(name)

    def _replace_allowed(self, path: Path, entry: _Entry) -> None:
        """A later member may replace an earlier file of the same name, never a directory."""
        try:
            existing = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(existing):
            raise UnsafeArchiveError(f"archive member {entry.name!r} replaces a directory")
        os.unlink(path)

    def _defer_symlink(self, entry: _Entry, name: str) -> None:
        target = entry.linkname
        problem = _link_target_problem(name, target, "the workspace")
        if problem is not None:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a symbolic link to {target!r}, {problem}"
            )
        self._path(name, entry)  # parents are created now, as real directories
        self.symlinks.append((name, target, entry.name))

    def _make_symlink(self, name: str, target: str, raw: str) -> None:
        path = self.root / name
        if os.path.lexists(path):
            raise UnsafeArchiveError(
                f"archive member {raw!r} is a symbolic link that would replace an extracted entry"
            )
        os.symlink(target, path)

    def _make_hardlink(self, entry: _Entry, name: str) -> None:
        target = self._safe_name(entry.linkname, entry, "is a hard link to")
        path = self._path(name, entry)
        if target not in self.files or target == name:
            raise UnsafeArchiveError(
                f"archive member {entry.name!r} is a hard link to {entry.linkname!r}, which is not "
                "a file extracted earlier from the same archive"
            )
        self._replace_allowed(path, entry)
        os.link(self.root / target, path, follow_symlinks=False)
        self.files.add(name)


def _file_mode(mode: int) -> int:
    """PEP 706 ``data`` rules: drop setuid/setgid/sticky and group/other write; owner can read+write."""
    mode = (mode & 0o755) | 0o600
    if not mode & 0o100:
        mode &= ~0o011
    return mode
