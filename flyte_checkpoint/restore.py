"""Turning one stored object into files: classify it, then unpack an archive or write a payload."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO, cast

from flyte_checkpoint import archive
from flyte_checkpoint.archive import ExtractionLimits, ObjectKind
from flyte_checkpoint.errors import CheckpointCorruptError
from flyte_checkpoint.storage.base import COPY_CHUNK, VerifyingReader
from flyte_checkpoint.storage.errors import translated_os_errors

PAYLOAD_BASENAME = "payload"
"""The file name under the restore directory where a raw (non-archive) object is placed."""


def classify(reader: VerifyingReader) -> tuple[ObjectKind, bool, IO[bytes]]:
    """The object's kind, whether it is gzipped, and the stream to read it from (from byte 0).

    The format recorded at save time wins; objects without a record (written by other tools)
    are recognised from their first bytes, as the reference SDK does.
    """
    recorded = reader.info.recorded_format
    stream = cast(IO[bytes], reader)
    if recorded == "archive":
        return "archive", True, stream
    if recorded == "payload":
        return "payload", False, stream
    head = reader.read(archive.SNIFF_BYTES)
    kind, compressed = archive.sniff_kind(head)
    return kind, compressed, cast(IO[bytes], io.BufferedReader(archive.PrefixedReader(head, stream)))


def restore_object(reader: VerifyingReader, dest: Path, *, limits: ExtractionLimits) -> Path:
    """Unpack the object behind ``reader`` into ``dest``; return ``dest`` or ``dest / "payload"``.

    Reads the object to its end, so its digest (and a gzip CRC) is checked before returning. On
    a damaged or unsafe object raises the :class:`CheckpointCorruptError` subclass naming the
    object's URI; what was written so far is left for the caller to remove.
    """
    kind, compressed, stream = classify(reader)
    try:
        if kind == "archive":
            with translated_os_errors(str(dest), "restoring"):
                archive.unpack_archive(stream, dest, compressed=compressed, limits=limits)
            return dest
        return write_payload(stream, dest / PAYLOAD_BASENAME)
    except CheckpointCorruptError as exc:
        raise type(exc)(
            f"cannot restore checkpoint {reader.info.uri}: {exc}; the object is damaged or unsafe, "
            "so nothing was restored (delete it or point the source at a sound one)"
        ) from exc


def write_payload(stream: IO[bytes], target: Path) -> Path:
    """Copy the whole stream to ``target`` via a temp name, so a failed read leaves no payload."""
    partial = target.with_name(f".{target.name}.partial")
    with translated_os_errors(str(partial), "restoring"), open(partial, "wb") as out:
        while chunk := stream.read(COPY_CHUNK):
            out.write(chunk)
    os.replace(partial, target)
    return target
