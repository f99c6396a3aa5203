"""The directory archive format: a streaming ``.tar.gz`` writer and a safe streaming reader.

This module knows byte streams only, never storage. A directory is tarred and compressed straight
into a writable stream, and an archive is unpacked straight from a readable stream: there is no
temporary archive and nothing is held whole in memory.

Extraction does not trust the archive. It follows the ``data`` filter rules of PEP 706 with its
own code, so that it behaves the same on every supported Python (the standard library's filter
had escapes fixed only in late patch releases): no absolute names, no ``..``, no device or FIFO
nodes, no setuid/setgid/sticky bits, hard links only to files already extracted, and symbolic
links created only after every file has been written, then checked to resolve inside the tree.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Iterator
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
# Errors that mean "the bytes are not a valid archive", as opposed to failures of the stream.
_FORMAT_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    *_ISAL_ERRORS,
)


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
        writer = _isal_gzip.open(sink, "wb", compresslevel=(level + 2) // 3, threads=1)
    else:
        writer = cast(IO[bytes], gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=level, mtime=0))
    try:
        yield writer
    finally:
        writer.close()


def pack_directory(source: Path, sink: IO[bytes], *, level: int = DEFAULT_COMPRESSION_LEVEL) -> None:
    """Write ``source``'s immediate children, recursively, as a ``.tar.gz`` stream into ``sink``.

    Symbolic links that stay inside ``source`` are stored as links; a link leaving it, a socket,
    a FIFO or a device node is refused before anything is written, because the archive could not
    be restored faithfully.
    """
    root = Path(os.path.realpath(source))
    entries = list(_walk(root))  # validate the whole tree before the first byte goes out
    with (
        gzip_writer(sink, level) as compressed,
        tarfile.open(fileobj=compressed, mode="w|", format=tarfile.PAX_FORMAT, bufsize=_CHUNK) as tar,
    ):
        tar.copybufsize = _CHUNK  # type: ignore[attr-defined]  # undocumented, 16 KiB default
        for path, arcname in entries:
            _add_entry(tar, root, path, arcname)


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
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
                _check_link_stays_inside(root, path)
            elif stat.S_ISDIR(mode):
                pending.append(path)
            elif not stat.S_ISREG(mode):
                raise InvalidCheckpointInputError(
                    f"cannot save {path}: it is a {describe_mode(mode)}, which a checkpoint "
                    "cannot hold; remove it from the directory or save a directory without it"
                )
            yield path, arcname


def _check_link_stays_inside(root: Path, link: Path) -> None:
    target = os.readlink(link)
    resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
    real = os.path.realpath(link)
    if not (_is_within(resolved, str(root)) and _is_within(real, str(root))):
        raise InvalidCheckpointInputError(
            f"cannot save {link}: it is a symbolic link to {target!r}, outside the directory "
            "being saved, so it could not be restored; copy the target into the directory "
            "or remove the link"
        )


def _add_entry(tar: tarfile.TarFile, root: Path, path: Path, arcname: str) -> None:
    info = tar.gettarinfo(str(path), arcname)
    if info.issym() and os.path.isabs(info.linkname):
        # Stored relative, so the tree still points at itself wherever it is restored.
        info.linkname = os.path.relpath(info.linkname, os.path.dirname(path))
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
# Sniffing
# ---------------------------------------------------------------------------------------------

SNIFF_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"


def sniff_kind(head: bytes) -> tuple[ObjectKind, bool]:
    """Guess from an object's first bytes whether it is a tar archive, and whether it is gzipped.

    Used only for objects that carry no recorded format (written by other tools or by the
    reference SDK): a gzip stream whose first block is a tar header, or a plain tar, is an
    archive; anything else is a payload.
    """
    if head.startswith(_GZIP_MAGIC):
        inflater = zlib.decompressobj(wbits=31)
        try:
            first = inflater.decompress(head, 2 * _TAR_BLOCK)
        except zlib.error:
            return "payload", False
        return ("archive", True) if _looks_like_tar(first) else ("payload", False)
    return ("archive", False) if _looks_like_tar(head) else ("payload", False)


def _looks_like_tar(head: bytes) -> bool:
    if len(head) < _TAR_BLOCK:
        return False
    block = head[:_TAR_BLOCK]
    if block == bytes(_TAR_BLOCK):
        # An empty archive is two zero blocks; a directory with no children saves as one.
        return head[: 2 * _TAR_BLOCK] == bytes(2 * _TAR_BLOCK)
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
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
    member. Raises :class:`CheckpointCorruptError` for a damaged stream and
    :class:`UnsafeArchiveError` for a member that would leave ``dest``; on error, what was
    extracted so far stays in ``dest`` for the caller to remove.
    """
    limits = limits or ExtractionLimits()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if compressed:
            with gzip_reader(source) as plain:
                _Extractor(Path(os.path.realpath(dest)), limits).run(plain)
                _drain(plain)
        else:
            _Extractor(Path(os.path.realpath(dest)), limits).run(source)
            _drain(source)
    except CheckpointError:
        raise
    except _FORMAT_ERRORS as exc:
        raise CheckpointCorruptError(f"damaged archive: {exc}") from exc


def _drain(stream: IO[bytes]) -> None:
    while stream.read(_CHUNK):
        pass


class _Extractor:
    """Writes the members of one tar stream below ``root``, refusing anything unsafe."""

    def __init__(self, root: Path, limits: ExtractionLimits) -> None:
        self.root = root
        self.limits = limits
        self.members = 0
        self.content_bytes = 0
        self.files: set[str] = set()
        self.directory_modes: list[tuple[Path, int]] = []
        self.symlinks: list[tuple[str, str]] = []

    def run(self, stream: IO[bytes]) -> None:
        with tarfile.open(fileobj=stream, mode="r|", bufsize=_CHUNK) as tar:
            for member in tar:
                self._count(member)
                name = self._safe_name(member.name)
                if member.isdir():
                    self._make_directory(name, member.mode)
                elif member.isreg():
                    self._write_file(tar, member, name)
                elif member.issym():
                    self._defer_symlink(member, name)
                elif member.islnk():
                    self._make_hardlink(member, name)
                else:
                    raise UnsafeArchiveError(
                        f"archive member {member.name!r} is a {_member_type(member)}; only files, "
                        "directories and links are restored"
                    )
        for name, target in self.symlinks:
            self._make_symlink(name, target)
        for directory, mode in reversed(self.directory_modes):
            os.chmod(directory, mode)

    def _count(self, member: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise ArchiveLimitError(
                f"archive holds more than {self.limits.max_members} members; raise "
                "ExtractionLimits.max_members if this checkpoint is genuine"
            )
        if member.isreg():
            self.content_bytes += member.size
            if self.content_bytes > self.limits.max_total_bytes:
                raise ArchiveLimitError(
                    f"archive unpacks to more than {self.limits.max_total_bytes} bytes (member "
                    f"{member.name!r} declares {member.size}); raise "
                    "ExtractionLimits.max_total_bytes if this checkpoint is genuine"
                )

    def _safe_name(self, raw: str) -> str:
        if "\x00" in raw:
            raise UnsafeArchiveError(f"archive member name {raw!r} contains a NUL byte")
        if raw.startswith(("/", "\\")) or (len(raw) > 1 and raw[1] == ":"):
            raise UnsafeArchiveError(f"archive member {raw!r} has an absolute path")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchiveError(f"archive member {raw!r} climbs out of the workspace with '..'")
        if not parts:
            return "."
        return "/".join(parts)

    def _path(self, name: str) -> Path:
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
                    f"archive member {name!r} would be written through {current.relative_to(self.root)!s}, "
                    "which is not a directory"
                )
        return self.root / name if name != "." else self.root

    def _make_directory(self, name: str, mode: int) -> None:
        path = self._path(name)
        try:
            existing = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        else:
            if not stat.S_ISDIR(existing):
                raise UnsafeArchiveError(f"archive member {name!r} replaces a file by a directory")
        # Applied last, so a read-only directory does not block writing its children.
        self.directory_modes.append((path, (mode & 0o755) | 0o700))

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        path = self._path(name)
        self._replace_allowed(path, name)
        content = tar.extractfile(member)
        if content is None:  # pragma: no cover - tarfile returns a reader for every regular file
            raise CheckpointCorruptError(f"archive member {name!r} has no readable content")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        written = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := content.read(_CHUNK):
                out.write(chunk)
                written += len(chunk)
        if written != member.size:
            raise CheckpointCorruptError(
                f"archive member {name!r} is truncated: {written} of {member.size} bytes"
            )
        os.chmod(path, _file_mode(member.mode))
        os.utime(path, (member.mtime, member.mtime))
        self.files.add(name)

    def _replace_allowed(self, path: Path, name: str) -> None:
        """A later member may replace an earlier file of the same name, never a directory."""
        try:
            existing = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISDIR(existing):
            raise UnsafeArchiveError(f"archive member {name!r} replaces a directory")
        os.unlink(path)
        self.files.discard(name)

    def _defer_symlink(self, member: tarfile.TarInfo, name: str) -> None:
        target = member.linkname
        if not target or os.path.isabs(target) or "\x00" in target:
            raise UnsafeArchiveError(
                f"archive member {name!r} is a symbolic link to {target!r}, an absolute or empty target"
            )
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        if resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchiveError(
                f"archive member {name!r} is a symbolic link to {target!r}, outside the workspace"
            )
        self._path(name)  # parents are created now, as real directories
        self.symlinks.append((name, target))

    def _make_symlink(self, name: str, target: str) -> None:
        path = self._path(name)
        if os.path.lexists(path):
            raise UnsafeArchiveError(
                f"archive member {name!r} is a symbolic link that would replace an extracted entry"
            )
        os.symlink(target, path)
        real = os.path.realpath(path)
        if not _is_within(real, str(self.root)):
            os.unlink(path)
            raise UnsafeArchiveError(
                f"archive member {name!r} is a symbolic link that resolves outside the workspace"
            )

    def _make_hardlink(self, member: tarfile.TarInfo, name: str) -> None:
        target = self._safe_name(member.linkname)
        if target not in self.files:
            raise UnsafeArchiveError(
                f"archive member {name!r} is a hard link to {member.linkname!r}, which is not a "
                "file extracted earlier from the same archive"
            )
        path = self._path(name)
        self._replace_allowed(path, name)
        os.link(self.root / target, path, follow_symlinks=False)
        self.files.add(name)


def _file_mode(mode: int) -> int:
    """PEP 706 ``data`` rules: drop setuid/setgid/sticky and group/other write; owner can read+write."""
    mode = (mode & 0o755) | 0o600
    if not mode & 0o100:
        mode &= ~0o011
    return mode


def _member_type(member: tarfile.TarInfo) -> str:
    if member.ischr() or member.isblk():
        return "device node"
    if member.isfifo():
        return "FIFO (named pipe)"
    return f"member of tar type {member.type!r}"


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
