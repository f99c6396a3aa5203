"""Caps on what extracting one archive may cost."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIB = 1 << 20


class ExtractionLimits(BaseModel):
    """Caps that stop a hostile or runaway archive from filling the disk.

    Pass your own to ``Checkpoint(..., extraction_limits=ExtractionLimits(...))`` to load a
    genuine checkpoint that exceeds a default.
    """

    model_config = ConfigDict(frozen=True)

    max_members: int = Field(default=1_000_000, gt=0)
    """The most entries (files, directories, links) an archive may hold."""
    max_total_bytes: int = Field(default=1 << 40, gt=0)
    """The most bytes of file content an archive may unpack to (default 1 TiB)."""
    max_expansion_ratio: float | None = Field(default=100.0, gt=1)
    """The most bytes of file content a compressed archive may unpack to per byte read, once it
    has unpacked more than :attr:`expansion_checked_after_bytes` (``None``: no bound).

    Real checkpoints compress 1.1x (weights) to about 10x (text); gzip reaches 1000x only on
    runs of one byte value, which is how a small object that unpacks to a full disk is made."""
    expansion_checked_after_bytes: int = Field(default=256 * MIB, ge=0)
    """Below this much unpacked content the ratio is not checked, so small archives of zeros
    (an untouched optimizer state, an empty buffer) always load."""
