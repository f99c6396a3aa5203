"""The tar stream writer: POSIX ustar headers, with PAX records only where ustar cannot hold a value.

:mod:`tarfile`'s writer costs tens of microseconds per member (user and group name look-ups, a
PAX header for every sub-second mtime built through several layers, a stream buffer grown by
copying) and keeps every member's ``TarInfo`` and every file's inode for the whole archive. With
many small files that was 20x the time of ``tar -czf`` and about a KiB of memory per file. This
writer formats each header with one ``struct`` call, keeps nothing per member (only files with
several hard links are remembered, to store the later names as links) and hands the compressor
one joined buffer per MiB.
"""

from __future__ import annotations

import os
import struct
import tarfile
from typing import Protocol

from flyte_checkpoint.archive.compression import CHUNK
from flyte_checkpoint.archive.member_writer import shrank
from flyte_checkpoint.archive.tar_headers import byte_sum

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_HEADER = struct.Struct("100s8s8s8s12s12s8sc100s8s32s32s8s8s155s12x")
_BLANK_CHECKSUM = b" " * 8
_MAGIC = b"ustar\x0000"
_MAX_OCTAL_7 = 8**7 - 1
_MAX_OCTAL_11 = 8**11 - 1
_PAX_NAME = b"././@PaxHeader"
_SMALL_FILE = 1 << 20
"""Files up to this size are read in one call and joined into the output buffer."""


def _header(
    name: bytes, mode: int, uid: int, gid: int, size: int, mtime: int, kind: bytes, link: bytes
) -> bytearray:
    block = bytearray(
        _HEADER.pack(
            name,
            b"%07o\x00" % mode,
            b"%07o\x00" % uid,
            b"%07o\x00" % gid,
            b"%011o\x00" % size,
            b"%011o\x00" % mtime,
            _BLANK_CHECKSUM,
            kind,
            link,
            _MAGIC,
            b"",
            b"",
            b"",
            b"",
            b"",
        )
    )
    block[148:156] = b"%06o\x00 " % byte_sum(block)
    return block


def _pax_record(key: bytes, value: bytes) -> bytes:
    """One ``"<length> <key>=<value>\\n"`` record; the length counts its own digits."""
    body = len(key) + len(value) + 3
    length = body + len(str(body))
    if len(str(length)) != len(str(body)):
        length += 1
    return b"%d %s=%s\n" % (length, key, value)


def _padding(size: int) -> bytes:
    return bytes(-size % _BLOCK)


class TarSink(Protocol):
    """Where a tar stream goes: bytes, and large files' descriptors to be read by the sink
    (:class:`~.member_writer.MemberWriter` reads them on its encoding threads)."""

    def write(self, data: bytes, /) -> int: ...

    def write_file(self, fd: int, path: str, size: int) -> None:
        """Take the open file ``fd`` and write its first ``size`` bytes; closes ``fd``."""


class TarWriter:
    """Writes members to ``out``, buffering about a MiB."""

    def __init__(self, out: TarSink) -> None:
        self._out = out
        self._parts: list[bytes] = []
        self._buffered = 0
        self._written = 0
        self._linked: dict[tuple[int, int], bytes] = {}

    def _put(self, data: bytes) -> None:
        self._parts.append(data)
        self._buffered += len(data)
        if self._buffered >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._parts:
            # One joined copy: a threaded compressor may hold on to what it is given.
            self._out.write(b"".join(self._parts))
            self._written += self._buffered
            self._parts.clear()
            self._buffered = 0

    @staticmethod
    def _headers(name: str, status: os.stat_result, kind: bytes, size: int, link: bytes = b"") -> bytes:
        """The header block of one member, after a PAX header when ustar cannot hold a value."""
        raw = os.fsencode(name)
        pax: list[bytes] = []
        if len(raw) > 100 or not raw.isascii():
            pax.append(_pax_record(b"path", raw))
            raw = raw[:100]
        if len(link) > 100 or not link.isascii():
            pax.append(_pax_record(b"linkpath", link))
            link = link[:100]
        if size > _MAX_OCTAL_11:
            pax.append(_pax_record(b"size", b"%d" % size))
        seconds, nanos = divmod(status.st_mtime_ns, 1_000_000_000)
        if nanos or not 0 <= seconds <= _MAX_OCTAL_11:
            whole, fraction = divmod(abs(status.st_mtime_ns), 1_000_000_000)
            sign = b"-" if status.st_mtime_ns < 0 else b""
            pax.append(
                _pax_record(b"mtime", (b"%s%d.%09d" % (sign, whole, fraction)).rstrip(b"0").rstrip(b"."))
            )
        uid, gid = status.st_uid, status.st_gid
        if uid > _MAX_OCTAL_7:
            pax.append(_pax_record(b"uid", b"%d" % uid))
        if gid > _MAX_OCTAL_7:
            pax.append(_pax_record(b"gid", b"%d" % gid))
        main = _header(
            raw,
            status.st_mode & 0o7777,
            uid if uid <= _MAX_OCTAL_7 else 0,
            gid if gid <= _MAX_OCTAL_7 else 0,
            size if size <= _MAX_OCTAL_11 else 0,
            seconds if 0 <= seconds <= _MAX_OCTAL_11 else 0,
            kind,
            link,
        )
        if not pax:
            return bytes(main)
        records = b"".join(pax)
        extended = _header(_PAX_NAME, 0o644, 0, 0, len(records), 0, tarfile.XHDTYPE, b"")
        return b"".join((extended, records, _padding(len(records)), main))

    def add_directory(self, name: str, status: os.stat_result) -> None:
        self._put(self._headers(name + "/", status, tarfile.DIRTYPE, 0))

    def add_symlink(self, name: str, status: os.stat_result, target: str) -> None:
        self._put(self._headers(name, status, tarfile.SYMTYPE, 0, os.fsencode(target)))

    def add_file(self, name: str, path: str, status: os.stat_result) -> None:
        """A regular file, or a hard link to a file of the same inode added earlier."""
        if status.st_nlink > 1:
            inode = (status.st_dev, status.st_ino)
            first = self._linked.get(inode)
            if first is not None:
                self._put(self._headers(name, status, tarfile.LNKTYPE, 0, first))
                return
            self._linked[inode] = os.fsencode(name)
        size = status.st_size
        if size > _SMALL_FILE:
            self._put(self._headers(name, status, tarfile.REGTYPE, size))
            self._flush()
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            self._out.write_file(fd, path, size)  # takes fd; read on the encoding threads
            self._written += size
            self._put(_padding(size))
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            data = os.read(fd, size)
            while len(data) < size and (more := os.read(fd, size - len(data))):
                data += more
        finally:
            os.close(fd)
        if len(data) < size:
            raise shrank(path, size, len(data))
        self._put(b"".join((self._headers(name, status, tarfile.REGTYPE, size), data, _padding(size))))

    def close(self) -> None:
        """Write the end-of-archive blocks (padded to a whole record, as tar does) and flush."""
        end = 2 * _BLOCK
        self._put(bytes(end + -(self._written + self._buffered + end) % _RECORD))
        self._flush()
