"""Sniffing: whether an object with no recorded format is a (gzipped) tar archive."""

from __future__ import annotations

import zlib
from typing import Literal

from flyte_checkpoint.archive.tar_headers import TAR_BLOCK, ZERO_BLOCK, is_header

ObjectKind = Literal["archive", "payload"]

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
            first = inflater.decompress(head, 2 * TAR_BLOCK)
        except zlib.error:
            return "archive", True
        if _looks_like_tar(first) or first[257:262] == b"ustar":
            return "archive", True
        if len(first) < 2 * TAR_BLOCK and not inflater.eof:
            return "archive", True  # the stream stops early: truncated
        return "payload", False
    return ("archive", False) if _looks_like_tar(head) else ("payload", False)


def _looks_like_tar(head: bytes) -> bool:
    if len(head) < TAR_BLOCK:
        return False
    block = head[:TAR_BLOCK]
    if block == ZERO_BLOCK:
        # An empty archive is two zero blocks; a directory with no children saves as one.
        return head[: 2 * TAR_BLOCK] == bytes(2 * TAR_BLOCK)
    return is_header(block)
