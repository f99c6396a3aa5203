"""The tar stream parser: ustar, PAX and GNU long-name headers, checksummed and capped."""

from __future__ import annotations

import math
import re
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from flyte_checkpoint.archive.compression import CHUNK
from flyte_checkpoint.archive.routing import Piece, Route
from flyte_checkpoint.errors import ArchiveLimitError, CheckpointCorruptError

TAR_BLOCK = tarfile.BLOCKSIZE
ZERO_BLOCK = bytes(TAR_BLOCK)
_MAX_EXTENDED_HEADER = 1 << 20
"""The most bytes of PAX / GNU long-name headers one member may carry (paths are < 4 KiB)."""
FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
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


def byte_sum(block: bytes | bytearray) -> int:
    """The sum of a 512-byte header's bytes, as the tar checksum counts them.

    Adler-32's low half is 1 + the byte sum modulo 65521; a 256-byte half sums to at most 65280,
    so two halves give the exact sum at C speed (``sum()`` over 512 ints cost a tenth of the
    time spent per small file).
    """
    view = memoryview(block)
    return (zlib.adler32(view[:256]) & 0xFFFF) + (zlib.adler32(view[256:]) & 0xFFFF) - 2


def parse_header(block: bytes, offset: int) -> _Header:
    """Decode a non-zero header block; a checksum mismatch or bad number is corruption."""
    stored = _number(block[148:156], "checksum", offset)
    unsigned = 256 + byte_sum(block) - sum(block[148:156])  # the field counts as 8 spaces
    # Some old tars summed signed bytes; computed only when the usual sum does not match.
    if stored != unsigned and stored != 256 + sum(struct.unpack_from("148b8x356b", block)):
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


def is_header(block: bytes) -> bool:
    """Whether ``block`` is a sound tar header."""
    try:
        parse_header(block, 0)
    except CheckpointCorruptError:
        return False
    return True


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
class Entry:
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


class TarReader:
    """Reads tar members from a stream, one at a time, with their data on demand."""

    def __init__(self, stream: IO[bytes], padding: Callable[[int], None] | None = None) -> None:
        """``padding(count)`` is told of each ``count`` zero bytes read after the end-of-archive
        block, so that they count against the caller's limits like content does."""
        self._stream = stream
        # A stream that can hand over its bytes without copying them (IndexedReader) does, for
        # member data: what is read is written to a file or skipped, never kept.
        self._read_view: Callable[[int], Piece] = getattr(stream, "read_view", stream.read)
        self._route: Callable[[int, Route], None] | None = getattr(stream, "route", None)
        self._padding_read = padding
        self.position = 0
        self._global: dict[str, str] = {}
        self._global_bytes = 0
        self._data_left = 0
        self._padding = 0
        self._current: Entry | None = None

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
            chunk = self._read_view(min(size, CHUNK))
            if not chunk:
                raise self._truncated("it ends inside a member's data")
            self.position += len(chunk)
            size -= len(chunk)

    def _check_only_zeros_follow(self, end: int) -> None:
        """Read the stream to its end: after the end-of-archive block at ``end`` only zeros may
        follow (the padding of tar's last record), never a second archive or other data.

        Both would be ignored otherwise: two ``.tar.gz`` files concatenated unpack as one tar
        stream that holds a second archive after the first one's end, which loaded as the first
        alone while bytes after the gzip stream were refused.
        """
        while chunk := self._read(CHUNK):
            if chunk.count(0) == len(chunk):
                if self._padding_read is not None:
                    self._padding_read(len(chunk))
                continue
            start = self.position - len(chunk)
            found = start + len(chunk) - len(chunk.lstrip(b"\x00"))
            block_start = found - found % TAR_BLOCK
            block = chunk[block_start - start : block_start - start + TAR_BLOCK]
            if block_start >= start and len(block) == TAR_BLOCK and is_header(block):
                what = (
                    f"a second archive starts at byte {block_start} (its first member is "
                    f"{parse_header(block, block_start).name!r}): two archives were concatenated "
                    "(cat a.tar.gz b.tar.gz), and only the first would be restored"
                )
            else:
                what = f"data that is not part of it starts at byte {found}"
            raise CheckpointCorruptError(
                f"archive is damaged: after its end-of-archive marker (byte {end} of the tar "
                f"stream), {what}; a checkpoint holds one archive, so re-create it as one (tar "
                "czf of the whole tree)"
            )

    def route_data(self, route: Route) -> None:
        """Have the stream write the current member's data through ``route`` where it can,
        before any of it is read (:mod:`.routing`): :meth:`read_data` then hands on what was
        written as :class:`~.routing.Written` pieces."""
        if self._route is not None:
            self._route(self._data_left, route)

    def read_data(self, size: int) -> list[Piece]:
        """Up to ``size`` bytes of the current member's data, as the pieces the stream hands
        over (they are not joined: that would copy every byte once more; where the stream can
        hand over views of its own immutable bytes it does, and routed data comes as
        :class:`~.routing.Written` pieces); ``[]`` once it is all read."""
        size = min(size, self._data_left)
        pieces: list[Piece] = []
        while size:
            data = self._read_view(size)
            if not data:
                name = self._current.name if self._current else "?"
                raise self._truncated(f"member {name!r} ends early")
            pieces.append(data)
            self.position += len(data)
            self._data_left -= len(data)
            size -= len(data)
        return pieces

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
        self._skip(-header.size % TAR_BLOCK)
        return data

    def next(self) -> Entry | None:
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
            block = self._read(TAR_BLOCK)
            if len(block) < TAR_BLOCK:
                raise self._truncated("it ends before the end-of-archive marker")
            if block == ZERO_BLOCK:
                if pax or long_name is not None or long_link is not None:
                    raise CheckpointCorruptError(
                        f"archive is damaged at byte {offset}: an extended header is followed by no member"
                    )
                self._check_only_zeros_follow(offset)
                return None
            header = parse_header(block, offset)
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
        entry = Entry(
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
        self._padding = -self._data_left % TAR_BLOCK
        self._current = entry
        return entry
