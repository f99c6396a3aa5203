"""Caps on what extracting one archive may cost."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ExtractionLimits(BaseModel):
    """Caps that stop a hostile or runaway archive from filling the disk."""

    model_config = ConfigDict(frozen=True)

    max_members: int = Field(default=1_000_000, gt=0)
    """The most entries (files, directories, links) an archive may hold."""
    max_total_bytes: int = Field(default=1 << 40, gt=0)
    """The most bytes of file content an archive may unpack to (default 1 TiB)."""
