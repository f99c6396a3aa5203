"""The indexed gzip layout: a ``.tar.gz`` written as independent gzip members, plus an index.

Every gzip reader (``gzip -d``, ``tar -xzf``, :mod:`gzip`, flyte-sdk) reads concatenated gzip
members as one stream, so an archive cut into members is still one ordinary ``.tar.gz``. This
package writes one member per :data:`BLOCK` bytes of tar stream (as BGZF and pigz do), which
lets a load inflate members on several cores at once, and lets a save store a block that
deflate would not shrink as *stored* deflate blocks (a copy and a CRC) instead of paying a core
for a few percent.

Each member carries, in a gzip extra field (``FEXTRA``, subfield ``FC``), this layout's version,
what the member is and its own length, so a reader can split the stream into members without
inflating it. After the data members come *index* members (no content; the extra field lists
every data member's compressed and uncompressed size) and a fixed-size *tail* member that says
where the index starts: a ranged reader finds the index from the object's last
:data:`TAIL_SIZE` bytes. Plain gzip readers inflate the index members to nothing and the tail
to one tar block of zeros, which tar readers take as padding after the end of the archive.

This module is sans-I/O: it encodes and decodes members held in memory.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from flyte_checkpoint.errors import ArchiveIndexError

_isal_zlib: Any
try:  # python-isal deflates 5-10x faster than zlib, outside the GIL.
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - exercised only where isal has no wheel
    _isal_zlib = None

_INFLATE_ERRORS: tuple[type[BaseException], ...] = (
    (zlib.error,) if _isal_zlib is None else (zlib.error, _isal_zlib.error)
)

VERSION = 1
"""The layout version written; members of a newer version are read by the streaming path."""
BLOCK = 1 << 20
"""Bytes of tar stream per data member (the last may be shorter)."""
SAMPLE = 16 * 1024
"""Bytes of each window a block's compressibility is judged by (three per block)."""
STORE_ABOVE = 0.90
"""A block whose samples deflate to more than this fraction of their size is stored as is."""

Parts = list[bytes | memoryview]
"""A member as the parts it is written in, in order."""

KIND_DATA, KIND_INDEX, KIND_TAIL = 0, 1, 2
_KINDS = {KIND_DATA: "data", KIND_INDEX: "index", KIND_TAIL: "tail"}
_SUBFIELD_ID = b"FC"
_GZIP_FIXED = struct.Struct("<2sBBIBBH")  # magic, method, flags, mtime, xfl, os, xlen
_GZIP_MAGIC = b"\x1f\x8b"
_FEXTRA = 0x04
_SUBFIELD = struct.Struct("<2sH")
_COMMON = struct.Struct("<BBI")  # version, kind, member length
_DATA = struct.Struct("<I")  # uncompressed length
_INDEX_HEAD = struct.Struct("<I")  # entries in this index member
_ENTRY = struct.Struct("<II")  # compressed (member) length, uncompressed length
_TAIL = struct.Struct("<QQQ")  # offset of the first index member, data members, uncompressed bytes
_TRAILER = struct.Struct("<II")  # CRC-32, uncompressed length mod 2**32
_KIND_FIELDS = {KIND_DATA: _DATA.size, KIND_INDEX: _INDEX_HEAD.size, KIND_TAIL: _TAIL.size}
"""Bytes of each kind's fields after the common ones: exactly, or at least for an index member."""
_EMPTY_DEFLATE = b"\x03\x00"  # one final fixed-Huffman block holding nothing
_STORED_MAX = 0xFFFF
HEADER_PREFIX = _GZIP_FIXED.size + _SUBFIELD.size + _COMMON.size
"""Bytes from a member's start through its length field: enough to frame it."""
DATA_HEADER = HEADER_PREFIX + _DATA.size
"""Bytes of a data member's header: enough for :func:`declared_size` too."""
INDEX_ENTRIES = (0xFFFF - _SUBFIELD.size - _COMMON.size - _INDEX_HEAD.size) // _ENTRY.size
"""The most data members one index member lists (an extra field holds at most 64 KiB)."""


def _header(kind: int, extra: bytes, body_length: int) -> bytes:
    """The gzip header of a member whose deflate data and trailer take ``body_length`` bytes."""
    payload_length = _COMMON.size + len(extra)
    header_length = _GZIP_FIXED.size + _SUBFIELD.size + payload_length
    return b"".join(
        (
            _GZIP_FIXED.pack(_GZIP_MAGIC, 8, _FEXTRA, 0, 0, 255, _SUBFIELD.size + payload_length),
            _SUBFIELD.pack(_SUBFIELD_ID, payload_length),
            _COMMON.pack(VERSION, kind, header_length + body_length),
            extra,
        )
    )


def _stored(block: bytes) -> bytes:
    """``block`` as stored deflate blocks (no compression), the last one final."""
    return bytes(_frame_stored(_laid_out(block), len(block)))


def _laid_out(block: bytes | memoryview) -> memoryview:
    """A new buffer holding ``block`` as :func:`place` lays content out."""
    buffer = memoryview(bytearray(laid_out_size(len(block))))
    place(buffer, len(block), 0, block)
    return buffer


_STORED_HEADER = struct.Struct("<BHH")  # BFINAL and BTYPE 00, LEN, NLEN
_STORED_SPAN = _STORED_HEADER.size + _STORED_MAX


def laid_out_size(size: int) -> int:
    """Bytes of a buffer that holds ``size`` bytes of content as :func:`place` lays them out."""
    return size + _STORED_HEADER.size * max(1, -(-size // _STORED_MAX))


def content_views(buffer: memoryview, size: int) -> list[memoryview]:
    """Where the ``size`` bytes of a block's content go in ``buffer``: 65,535 at a time, each
    after room for a stored deflate block's header, so that storing the block needs no copy."""
    starts = (number * _STORED_SPAN + _STORED_HEADER.size for number in range(-(-size // _STORED_MAX)))
    return [
        buffer[at : at + min(_STORED_MAX, size - done)]
        for done, at in zip(range(0, size, _STORED_MAX), starts, strict=True)
    ]


def place(buffer: memoryview, size: int, offset: int, data: bytes | memoryview) -> None:
    """Copy ``data`` to content offset ``offset`` of the block of ``size`` bytes in ``buffer``."""
    for view, start in spans(buffer, size, offset, len(data)):
        view[:] = data[start : start + len(view)]


def spans(buffer: memoryview, size: int, offset: int, length: int) -> list[tuple[memoryview, int]]:
    """The views of ``buffer`` that hold content bytes ``offset`` to ``offset + length`` of the
    block of ``size`` bytes, each with where it starts in that range."""
    found: list[tuple[memoryview, int]] = []
    if not length:
        return found
    first, last = offset // _STORED_MAX, (offset + length - 1) // _STORED_MAX
    for number in range(first, last + 1):
        start = max(offset, number * _STORED_MAX)
        end = min(offset + length, (number + 1) * _STORED_MAX, size)
        at = number * _STORED_SPAN + _STORED_HEADER.size + start - number * _STORED_MAX
        found.append((buffer[at : at + end - start], start - offset))
    return found


def past(views: list[memoryview], count: int) -> list[memoryview]:
    """``views`` without their first ``count`` bytes: what a vectored read or write that moved
    ``count`` bytes leaves to do."""
    rest = list(views)
    while rest and count >= len(rest[0]):
        count -= len(rest.pop(0))
    if count:
        rest[0] = rest[0][count:]
    return rest


def _frame_stored(buffer: memoryview, size: int) -> memoryview:
    """The stored deflate blocks of the content laid out in ``buffer``, their headers written
    into the room left for them: one view, no copy."""
    views = content_views(buffer, size) or [buffer[_STORED_HEADER.size : _STORED_HEADER.size]]
    for number, view in enumerate(views):
        final = number == len(views) - 1
        _STORED_HEADER.pack_into(buffer, number * _STORED_SPAN, final, len(view), len(view) ^ 0xFFFF)
    return buffer[: laid_out_size(size)]


_ISAL_MEM_LEVEL = 2
"""zlib's ``memLevel`` for ISA-L's deflate: ISA-L maps 2 to its small hash table, which on
1 MiB blocks wrote 0.4% less than its default (8) on training logs and 0.2% less on Python
sources, at the same speed; half-precision weights grew 0.2%, still 2% under the single stream
saves wrote before. The margin is what makes text trees robustly no larger than that stream."""


def _isal_level(level: int) -> int:
    """The ISA-L level (it knows 0-3; its 0 is not a stored level) for zlib's ``level`` 1-9.

    Levels 1-6 take ISA-L's 2, not its 1: measured on 1 MiB blocks of Python source and of
    training logs, level 2 costs 3-6% more time and writes 0.4-1.4% less, which more than makes
    up for what independent members lose by starting with an empty window (0.07% on logs), so
    text trees compress at least as well as the single stream did at ISA-L 1. Levels 7-9 take 3.
    """
    return 2 if level <= 6 else 3


def _raw_deflate(data: bytes | memoryview, level: int) -> bytes:
    """Raw deflate of ``data`` ending in a final block; python-isal's releases the GIL."""
    if _isal_zlib is None:
        return _zlib_deflate(data, level)
    deflater = _isal_zlib.compressobj(_isal_level(level), _isal_zlib.DEFLATED, -15, _ISAL_MEM_LEVEL)
    return bytes(deflater.compress(data) + deflater.flush())


def _deflate(block: bytes | memoryview, level: int) -> tuple[bytes, int]:
    """Raw deflate of ``block`` ending in a final block, and its CRC-32."""
    return _raw_deflate(block, level), crc32(block)


def _zlib_deflate(data: bytes | memoryview, level: int) -> bytes:
    deflater = zlib.compressobj(level, zlib.DEFLATED, -15)
    return deflater.compress(data) + deflater.flush()


def crc32(data: bytes | memoryview, start: int = 0) -> int:
    """The CRC-32 of ``data`` continuing from ``start`` (python-isal's, outside the GIL, where installed)."""
    return int(_isal_zlib.crc32(data, start)) if _isal_zlib is not None else zlib.crc32(data, start)


def worth_compressing(block: bytes | memoryview, level: int) -> bool:
    """Whether deflate at ``level`` shrinks ``block`` by more than ``1 - STORE_ABOVE``, judged
    from three windows (start, middle, end): weights and already-compressed files are not."""
    return _worth_compressing(_laid_out(block), len(block), level)


def _worth_compressing(buffer: memoryview, size: int, level: int) -> bool:
    """:func:`worth_compressing` for the block of ``size`` bytes laid out in ``buffer``."""
    if level == 0:
        return False
    windows = (
        [(0, size)]
        if size <= 3 * SAMPLE
        else [(at, SAMPLE) for at in (0, (size - SAMPLE) // 2, size - SAMPLE)]
    )
    sample = b"".join(view for at, length in windows for view, _ in spans(buffer, size, at, length))
    # One call for the three windows: deflate's set-up per call costs as much as a window (and
    # a compressor object's more, so the judgement takes ISA-L's default table, not the saves').
    if _isal_zlib is not None:
        deflated = len(_isal_zlib.compress(sample, _isal_level(level), wbits=-15))
    else:
        deflated = len(_zlib_deflate(sample, level))
    return deflated < STORE_ABOVE * len(sample)


def encode_data(block: bytes | memoryview, level: int) -> Parts:
    """One data member holding ``block`` (at most :data:`BLOCK` bytes): see :func:`encode_laid_out`."""
    return encode_laid_out(_laid_out(block), len(block), level)


def encode_laid_out(buffer: memoryview, size: int, level: int) -> Parts:
    """One data member holding the block of ``size`` bytes (at most :data:`BLOCK`, at least 1)
    laid out in ``buffer`` by :func:`place`, in parts to be written in order; the last part is
    the 8-byte trailer. Deflated at ``level`` when that is worth it (:func:`worth_compressing`),
    else stored, as one view of ``buffer``: it must not change until the parts are written."""
    views = content_views(buffer, size)
    body: bytes | memoryview
    if _worth_compressing(buffer, size, level):
        body, crc = _deflate(b"".join(views), level)
    else:
        crc = 0
        for view in views:
            crc = crc32(view, crc)
        body = _frame_stored(buffer, size)
    trailer = _TRAILER.pack(crc, size & 0xFFFFFFFF)
    return [_header(KIND_DATA, _DATA.pack(size), len(body) + len(trailer)), body, trailer]


@functools.cache
def _fixed_body(kind: int) -> bytes:
    """The deflate data and trailer of an index or tail member: an index member holds nothing;
    the tail holds one tar block of zeros (read as padding after the end-of-archive blocks),
    so that the object never ends in zero bytes a crash or a zero-filled range could leave."""
    if kind == KIND_INDEX:
        return _EMPTY_DEFLATE + _TRAILER.pack(0, 0)
    content = bytes(TAIL_CONTENT)
    return _stored(content) + _TRAILER.pack(crc32(content), len(content))


TAIL_CONTENT = 512
"""Bytes of zeros the tail member holds."""


def _empty_member(kind: int, extra: bytes) -> bytes:
    body = _fixed_body(kind)
    return _header(kind, extra, len(body)) + body


TAIL_SIZE = len(_empty_member(KIND_TAIL, _TAIL.pack(0, 0, 0)))
"""Bytes of the tail member, the last of every indexed archive."""


def encode_index(entries: list[tuple[int, int]], index_offset: int) -> bytes:
    """The index members listing ``entries`` (member length, uncompressed length) of the data
    members, followed by the tail; ``index_offset`` is where the first index member will start."""
    members = [
        _empty_member(
            KIND_INDEX,
            _INDEX_HEAD.pack(len(part)) + b"".join(_ENTRY.pack(*entry) for entry in part),
        )
        for part in (entries[at : at + INDEX_ENTRIES] for at in range(0, len(entries), INDEX_ENTRIES))
    ]
    total = sum(usize for _, usize in entries)
    members.append(_empty_member(KIND_TAIL, _TAIL.pack(index_offset, len(entries), total)))
    return b"".join(members)


@dataclass(frozen=True)
class Frame:
    """What a member's header says about it."""

    kind: int
    length: int
    header_length: int


def is_indexed(head: bytes) -> bool:
    """Whether ``head`` (at least :data:`HEADER_PREFIX` bytes) starts a member of this layout
    that this version reads; other gzip streams (and newer layouts) take the streaming path."""
    if len(head) < HEADER_PREFIX:
        return False
    magic, method, flags, _, _, _, xlen = _GZIP_FIXED.unpack_from(head)
    ident, size = _SUBFIELD.unpack_from(head, _GZIP_FIXED.size)
    version, kind, _ = _COMMON.unpack_from(head, _GZIP_FIXED.size + _SUBFIELD.size)
    return (
        (magic, method, flags, ident) == (_GZIP_MAGIC, 8, _FEXTRA, _SUBFIELD_ID)
        and xlen == _SUBFIELD.size + size
        and version == VERSION
        and kind in _KINDS
    )


def frame(head: bytes, offset: int) -> Frame:
    """The frame of the member at ``offset`` whose first :data:`HEADER_PREFIX` bytes are ``head``."""
    if not is_indexed(head):
        raise ArchiveIndexError(
            f"damaged archive: the gzip member at byte {offset} is not one of this package's "
            "indexed members, although the archive started as one"
        )
    _, _, _, _, _, _, xlen = _GZIP_FIXED.unpack_from(head)
    _, kind, length = _COMMON.unpack_from(head, _GZIP_FIXED.size + _SUBFIELD.size)
    header_length = _GZIP_FIXED.size + xlen
    fields = xlen - _SUBFIELD.size - _COMMON.size  # the bytes of the extra field left for the kind's own
    needed = _KIND_FIELDS[kind]
    if not (fields >= needed if kind == KIND_INDEX else fields == needed):
        raise ArchiveIndexError(
            f"damaged archive: the {_KINDS[kind]} member at byte {offset} has an extra field of "
            f"{xlen} bytes, which cannot hold the fields its kind has"
        )
    smallest, largest = _length_bounds(kind, header_length)
    if not smallest <= length <= largest:
        raise ArchiveIndexError(
            f"damaged archive: the {_KINDS[kind]} member at byte {offset} declares a length of "
            f"{length} bytes, outside the {smallest}-{largest} its layout allows"
        )
    return Frame(kind, length, header_length)


def _length_bounds(kind: int, header_length: int) -> tuple[int, int]:
    """The shortest and longest a member of ``kind`` with a header of ``header_length`` may be."""
    smallest = header_length + len(_EMPTY_DEFLATE) + _TRAILER.size
    largest = header_length + max(BLOCK + BLOCK // 10 + 1024, len(_fixed_body(kind))) + _TRAILER.size
    return smallest, largest


def data_length_fits(length: int) -> bool:
    """Whether a data member may be ``length`` bytes long (as :func:`frame` checks one)."""
    smallest, largest = _length_bounds(KIND_DATA, DATA_HEADER)
    return smallest <= length <= largest


SHORTEST_DATA_MEMBER = _length_bounds(KIND_DATA, DATA_HEADER)[0]
"""Bytes of the shortest data member :func:`frame` accepts."""


def index_size(count: int) -> int:
    """Bytes of the index members that list ``count`` data members (:func:`encode_index`)."""
    full, rest = divmod(count, INDEX_ENTRIES)
    member = HEADER_PREFIX + _INDEX_HEAD.size + len(_fixed_body(KIND_INDEX))
    return full * (member + INDEX_ENTRIES * _ENTRY.size) + (member + rest * _ENTRY.size if rest else 0)


def declared_size(rest: bytes | memoryview, offset: int) -> int:
    """The uncompressed size the data member at byte ``offset`` declares, from 1 to
    :data:`BLOCK` (anything else raises :class:`ArchiveIndexError`: the writer cuts whole blocks
    and never an empty one, so what a load keeps per member is bounded by the content the
    limits count); ``rest`` is the member after its first :data:`HEADER_PREFIX` bytes (which
    :func:`frame` read)."""
    (declared,) = _DATA.unpack_from(rest)
    if declared == 0:
        raise ArchiveIndexError(f"damaged archive: the data member at byte {offset} declares no content")
    if declared > BLOCK:
        raise ArchiveIndexError(
            f"damaged archive: the data member at byte {offset} declares {declared} bytes, over {BLOCK}"
        )
    return int(declared)


def decode_member(rest: bytes | memoryview, offset: int, frame_: Frame) -> list[memoryview] | bytes:
    """The checked content of a data member (``rest`` as for :func:`declared_size`): views of
    it when it is stored as this package stores one (:func:`stored_content`), else inflated
    (:func:`decode_data`). Either releases the GIL for its CRC-32 or inflation, so a load runs
    it on its pool: even the CRC of a stored MiB (about 0.1 ms) is more than the hand-over,
    and the reading thread is what bounds a load of incompressible weights."""
    if _is_stored(rest, frame_) and (views := stored_content(rest, offset, frame_)) is not None:
        return views
    return decode_data(rest, offset, frame_)


def _is_stored(rest: bytes | memoryview, frame_: Frame) -> bool:
    # This package stores a block whole or not at all: its first deflate block says which.
    start = frame_.header_length - HEADER_PREFIX
    return len(rest) > start and rest[start] & 0b110 == 0


@functools.lru_cache(maxsize=8)
def _stored_layout(size: int) -> tuple[tuple[int, int, int, bytes], ...]:
    """Where the stored deflate blocks of ``size`` bytes of content lie in a body laid out as
    :func:`place` lays them: each block's header offset, its content's start and end, and the
    header it must hold (computed once per size: most members are :data:`BLOCK` bytes)."""
    count = max(1, -(-size // _STORED_MAX))
    layout = []
    for number in range(count):
        length = min(_STORED_MAX, size - number * _STORED_MAX)
        at = number * _STORED_SPAN
        header = _STORED_HEADER.pack(number == count - 1, length, length ^ 0xFFFF)
        layout.append((at, at + _STORED_HEADER.size, at + _STORED_HEADER.size + length, header))
    return tuple(layout)


def stored_content(rest: bytes | memoryview, offset: int, frame_: Frame) -> list[memoryview] | None:
    """The content of a stored data member laid out as this package writes one (every stored
    deflate block but the last holds 65,535 bytes), as views of ``rest`` (as for
    :func:`declared_size`): no copy. Its block headers, size and CRC-32 are checked first;
    a member laid out any other way is ``None``, for :func:`decode_data` to inflate."""
    declared = declared_size(rest, offset)
    body = memoryview(rest)[frame_.header_length - HEADER_PREFIX : len(rest) - _TRAILER.size]
    if len(body) != laid_out_size(declared):
        return None
    views = []
    crc = 0
    checksum = _isal_zlib.crc32 if _isal_zlib is not None else zlib.crc32
    for header_at, start, end, header in _stored_layout(declared):
        if body[header_at:start] != header:
            return None
        if end > start:  # a member holds at least a byte (declared_size), but never hand on b""
            views.append(view := body[start:end])
            crc = checksum(view, crc)
    if _TRAILER.unpack_from(rest, len(rest) - _TRAILER.size) != (crc, declared & 0xFFFFFFFF):
        raise ArchiveIndexError(
            f"damaged archive: the data member at byte {offset} fails its CRC-32 or length check"
        )
    return views


def decode_data(rest: bytes | memoryview, offset: int, frame_: Frame) -> bytes:
    """The content of a data member (``rest`` as for :func:`declared_size`), checked: it must
    inflate to exactly the size its header declares, with a matching CRC-32 and length.
    Releases the GIL while inflating, so several members decode at once."""
    declared = declared_size(rest, offset)
    where = f"the data member at byte {offset}"
    body = memoryview(rest)[frame_.header_length - HEADER_PREFIX : len(rest) - _TRAILER.size]
    if _isal_zlib is not None:
        inflater = _isal_zlib.decompressobj(wbits=-15)
    else:
        inflater = zlib.decompressobj(wbits=-15)
    try:
        content = inflater.decompress(body, declared + 1)
    except _INFLATE_ERRORS as exc:
        raise ArchiveIndexError(f"damaged archive: {where} does not inflate: {exc}") from exc
    crc, size = _TRAILER.unpack_from(rest, len(rest) - _TRAILER.size)
    if len(content) != declared or not inflater.eof or inflater.unused_data or inflater.unconsumed_tail:
        raise ArchiveIndexError(
            f"damaged archive: {where} does not inflate to exactly the {declared} bytes it declares"
        )
    if size != declared & 0xFFFFFFFF or crc != crc32(content):
        raise ArchiveIndexError(f"damaged archive: {where} fails its CRC-32 or length check")
    return bytes(content)


def decode_index(member: bytes, offset: int) -> list[tuple[int, int]]:
    """The (member length, uncompressed length) entries of the index member ``member``."""
    extra_end = _GZIP_FIXED.size + _GZIP_FIXED.unpack_from(member)[-1]
    (count,) = _INDEX_HEAD.unpack_from(member, HEADER_PREFIX)
    start = HEADER_PREFIX + _INDEX_HEAD.size
    if start + count * _ENTRY.size != extra_end:
        raise ArchiveIndexError(
            f"damaged archive: the index member at byte {offset} says it lists {count} members, "
            f"but its extra field holds {(extra_end - start) / _ENTRY.size:g}"
        )
    return [_ENTRY.unpack_from(member, start + i * _ENTRY.size) for i in range(count)]


def decode_tail(member: bytes) -> tuple[int, int, int]:
    """The tail's (offset of the first index member, data members, uncompressed bytes)."""
    offset, count, total = _TAIL.unpack_from(member, HEADER_PREFIX)
    return offset, count, total


def check_fixed(member: bytes, offset: int, frame_: Frame) -> bytes:
    """The content of an index or tail member (nothing, or the tail's zeros), after checking
    it holds exactly that."""
    if member[frame_.header_length :] != _fixed_body(frame_.kind):
        raise ArchiveIndexError(
            f"damaged archive: the {_KINDS[frame_.kind]} member at byte {offset} does not hold "
            "what its kind allows"
        )
    return bytes(TAIL_CONTENT) if frame_.kind == KIND_TAIL else b""
