"""Listing the members of an archive without extracting it."""

from __future__ import annotations

import tarfile
from typing import IO, Literal, cast

from pydantic import BaseModel, ConfigDict

from flyte_checkpoint.archive.compression import tar_stream
from flyte_checkpoint.archive.limits import CountingReader, ExtractionLimits, LimitCounter
from flyte_checkpoint.archive.tar_headers import TarReader

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


def list_members(
    source: IO[bytes], *, compressed: bool = True, limits: ExtractionLimits | None = None
) -> list[MemberInfo]:
    """The members of the tar stream ``source``, read to its end (so its checks run) unextracted.

    Raises :class:`CheckpointCorruptError` for a damaged stream, like :func:`unpack_archive`,
    and :class:`ArchiveLimitError` past ``limits``, counted as an extraction counts them, so a
    listing (``verify``) refuses what a load would.
    """
    members: list[MemberInfo] = []
    counted = CountingReader(source)
    counter = LimitCounter(limits or ExtractionLimits(), (lambda: counted.count) if compressed else None)
    with tar_stream(cast(IO[bytes], counted), compressed=compressed) as plain:
        reader = TarReader(plain, counter.padding)
        while (entry := reader.next()) is not None:
            kind: MemberKind = _KINDS.get(entry.type, "other")
            content = entry.size if kind == "file" else 0
            counter.member(entry.name, content)
            counter.unpacked_bytes(content, entry.name)
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
    return members
