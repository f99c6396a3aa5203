"""Caps on what extracting one archive may cost, and the count that enforces them.

The defaults can be changed for every load in the process, wherever it happens (a runner, the
Flyte plugin, the command), with ``FLYTE_CHECKPOINT_MAX_MEMBERS``,
``FLYTE_CHECKPOINT_MAX_UNRECORDED_MEMBERS``, ``FLYTE_CHECKPOINT_MAX_TOTAL_BYTES`` and
``FLYTE_CHECKPOINT_MAX_EXPANSION_RATIO`` (the last two a number, or ``none`` for no bound). An
archive this package wrote records its content size; its load is bounded by that size instead of
the expansion ratio, and by :attr:`~ExtractionLimits.max_members` instead of the lower
:attr:`~ExtractionLimits.max_unrecorded_members` (see :meth:`ExtractionLimits.for_recorded`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import IO, ClassVar

from pydantic import Field

from flyte_checkpoint.archive.positional import PositionalReads, positional_reads
from flyte_checkpoint.errors import ArchiveLimitError, ConfigurationError
from flyte_checkpoint.strict_settings import StrictSettings

MIB = 1 << 20
MAX_MEMBERS_ENV = "FLYTE_CHECKPOINT_MAX_MEMBERS"
MAX_UNRECORDED_MEMBERS_ENV = "FLYTE_CHECKPOINT_MAX_UNRECORDED_MEMBERS"
MAX_TOTAL_BYTES_ENV = "FLYTE_CHECKPOINT_MAX_TOTAL_BYTES"
MAX_EXPANSION_RATIO_ENV = "FLYTE_CHECKPOINT_MAX_EXPANSION_RATIO"
MAX_MANIFEST_BYTES_ENV = "FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES"


def _raise_hint(env: str, setting: str = "...") -> str:
    """How to raise a limit that refused a load: per load (``ExtractionLimits(setting)``), or
    for every load of the process with ``env``."""
    return (
        "if this checkpoint is genuine, raise it with Checkpoint(..., extraction_limits="
        f"ExtractionLimits({setting})) or, for every load of the process, {env}"
    )


def _from_env(name: str, default: float | None, *, whole: bool, none_allowed: bool = False) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if none_allowed and raw.lower() == "none":
        return None
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = 0
    if not value > (0 if whole else 1) or value == float("inf"):
        accepted = "a whole number > 0" if whole else "a number > 1, or none"
        raise ConfigurationError(f"{name}={raw!r} is not {accepted}; fix it or unset it for the default")
    return value


def _default_members() -> int:
    return int(_from_env(MAX_MEMBERS_ENV, 1_000_000, whole=True) or 1_000_000)


def _default_manifest_bytes() -> int:
    return int(_from_env(MAX_MANIFEST_BYTES_ENV, 256 * MIB, whole=True) or 256 * MIB)


def manifest_limit_hint() -> str:
    """How to raise :attr:`ExtractionLimits.max_manifest_bytes`, for the error that refuses one."""
    return (
        _raise_hint(MAX_MANIFEST_BYTES_ENV, "max_manifest_bytes=...") + " (also read by garbage collection)"
    )


def _default_unrecorded_members() -> int | None:
    value = _from_env(MAX_UNRECORDED_MEMBERS_ENV, 10_000, whole=True, none_allowed=True)
    return None if value is None else int(value)


def _default_total() -> int:
    return int(_from_env(MAX_TOTAL_BYTES_ENV, 1 << 40, whole=True) or 1 << 40)


def _default_ratio() -> float | None:
    return _from_env(MAX_EXPANSION_RATIO_ENV, 100.0, whole=False, none_allowed=True)


class ExtractionLimits(StrictSettings):
    """Caps that stop a hostile or runaway archive from filling the disk.

    Pass your own to ``Checkpoint(..., extraction_limits=ExtractionLimits(...))`` to load a
    genuine checkpoint that exceeds a default. Frozen and validated: a misspelt field or an
    invalid value raises :class:`~flyte_checkpoint.errors.ConfigurationError` naming it (a
    misspelt limit used to be ignored, leaving the default in force).
    """

    NOUN: ClassVar[str] = "extraction limit"

    max_members: int = Field(default_factory=_default_members, gt=0)
    """The most entries (files, directories, links) an archive may hold (default 1,000,000)."""
    max_unrecorded_members: int | None = Field(default_factory=_default_unrecorded_members, gt=0)
    """The most entries an archive without this package's record may hold (default 10,000;
    ``None``: only :attr:`max_members`).

    Every member is a file created and, when the load is refused, removed: about 0.1-0.5 ms
    each on ext4, so a million empty members of a 14 MiB foreign archive cost minutes before
    :attr:`max_members` refused them. This bound refuses such an archive within seconds;
    archives this package saves carry its record and may hold up to :attr:`max_members`."""
    max_total_bytes: int = Field(default_factory=_default_total, gt=0)
    """The most bytes of file content an archive may unpack to (default 1 TiB)."""
    max_expansion_ratio: float | None = Field(default_factory=_default_ratio, gt=1)
    """The most bytes of file content a compressed archive may unpack to per byte read, once it
    has unpacked more than :attr:`expansion_checked_after_bytes` (``None``: no bound).

    Real checkpoints compress 1.1x (weights) to about 10x (text); gzip reaches 1000x only on
    runs of one byte value, which is how a small object that unpacks to a full disk is made."""
    expansion_checked_after_bytes: int = Field(default=256 * MIB, ge=0)
    """Below this much unpacked content the ratio is not checked, so small archives of zeros
    (an untouched optimizer state, an empty buffer) always load."""
    max_manifest_bytes: int = Field(default_factory=_default_manifest_bytes, gt=0)
    """The largest manifest of an incremental checkpoint read (default 256 MiB, or
    ``FLYTE_CHECKPOINT_MAX_MANIFEST_BYTES``, which garbage collection reads too). A manifest is
    read whole and parsed before its entries are counted: about 150 bytes per file with a short
    path and 80 more per 16 MiB chunk, so the default holds a million files; without a bound, a
    hostile multi-gigabyte object at the checkpoint's location would take that much memory and
    more to parse."""

    def for_recorded(self, content_size: int | None) -> ExtractionLimits:
        """These limits for an archive whose writer recorded ``content_size`` bytes of content.

        This package records it with every directory archive it saves: such an archive may
        expand as far as it says (zeros compress more than 1000x, a preallocated buffer saved
        fine and never loaded), but no further, and never past :attr:`max_total_bytes`, and
        may hold up to :attr:`max_members`. Without a record (an archive of another tool, or a
        hostile one) the expansion ratio and :attr:`max_unrecorded_members` apply.
        """
        if content_size is None:
            return self
        return self.model_copy(
            update={
                "max_expansion_ratio": None,
                "max_unrecorded_members": None,
                "max_total_bytes": max(1, min(self.max_total_bytes, content_size)),
            }
        )


class LimitCounter:
    """Counts one archive's members, content and compressed bytes against its limits.

    Shared by extracting and by listing (``verify``), so the two refuse the same archives.
    """

    def __init__(self, limits: ExtractionLimits, compressed_read: Callable[[], int] | None) -> None:
        self.limits = limits
        self._compressed_read = compressed_read
        self.members = 0
        self.declared = 0
        self.unpacked = 0

    def member(self, name: str, content_size: int) -> None:
        """Count a member declaring ``content_size`` bytes of content (0 for a non-file)."""
        self.members += 1
        unrecorded = self.limits.max_unrecorded_members
        if unrecorded is not None and unrecorded < self.limits.max_members and self.members > unrecorded:
            raise ArchiveLimitError(
                f"archive holds more than {unrecorded} members (member {name!r} is one too many) "
                "and records no content size of its own, so it was not saved by this package: "
                f"ExtractionLimits.max_unrecorded_members={unrecorded} bounds such archives, so "
                "that one of millions of members is refused in seconds; "
                + _raise_hint(MAX_UNRECORDED_MEMBERS_ENV)
            )
        if self.members > self.limits.max_members:
            raise ArchiveLimitError(
                f"archive holds more than {self.limits.max_members} members (member {name!r} is "
                f"one too many); " + _raise_hint(MAX_MEMBERS_ENV)
            )
        self.declared += content_size
        if self.declared > self.limits.max_total_bytes:
            raise ArchiveLimitError(
                f"archive unpacks to more than {self.limits.max_total_bytes} bytes (member {name!r} "
                f"declares {content_size}); " + _raise_hint(MAX_TOTAL_BYTES_ENV)
            )

    def padding(self, count: int) -> None:
        """Count ``count`` zero bytes read after the end-of-archive marker: tar pads its last
        record with a few KiB of them, and the expansion bound keeps a foreign archive from
        making a load inflate terabytes of them."""
        self._expanded(count, "in the zeros after its end-of-archive marker")

    def unpacked_bytes(self, count: int, name: str) -> None:
        """Count ``count`` bytes of content read from the archive, at member ``name``."""
        self._expanded(count, f"at member {name!r}")

    def _expanded(self, count: int, where: str) -> None:
        self.unpacked += count
        ratio, floor = self.limits.max_expansion_ratio, self.limits.expansion_checked_after_bytes
        if self._compressed_read is None or ratio is None or self.unpacked <= floor:
            return
        read = self._compressed_read()
        if self.unpacked > ratio * read:
            raise ArchiveLimitError(
                f"archive unpacked to {self.unpacked} bytes ({where}) from only {read} "
                f"compressed bytes, more than ExtractionLimits.max_expansion_ratio={ratio:g} times "
                f"(checked past {floor} bytes), and it records no content size of its own: this is "
                "how a decompression bomb looks; " + _raise_hint(MAX_EXPANSION_RATIO_ENV)
            )


class CountingReader(io.RawIOBase):
    """Reads ``source``, counting the bytes: the compressed size behind the expansion bound."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        data = self._source.read(-1 if size is None else size)
        self.count += len(data)
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def positional_reads(self) -> _CountedPositionalReads | None:
        """The source's reads at offsets, if it offers them, with skipped bytes counted too."""
        inner = positional_reads(self._source)
        return None if inner is None else _CountedPositionalReads(self, inner)


class _CountedPositionalReads:
    def __init__(self, counter: CountingReader, inner: PositionalReads) -> None:
        self._counter = counter
        self._inner = inner

    def consumed(self) -> int:
        return self._inner.consumed()

    def size(self) -> int:
        return self._inner.size()

    def read_at(self, offset: int, size: int) -> bytes:
        return self._inner.read_at(offset, size)

    def reserve(self, length: int) -> None:
        # Counted when reserved, not when skipped: the content of members read at offsets is
        # handed on before they are skipped in order, and the expansion bound weighs what was
        # handed on against the compressed bytes it came from.
        self._inner.reserve(length)
        self._counter.count += length

    def skip(self, length: int, crc: int) -> None:
        self._inner.skip(length, crc)
