"""One save of a helper, fixed when it is asked for: what is uploaded, its place in the order."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path

from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.single.saving.snapshot import Snapshot


@dataclass(frozen=True)
class SaveJob:
    """A save as the caller asked for it, built once and never changed after.

    ``snapshot`` holds what is uploaded (the caller's bytes or path for a blocking save, a
    private copy for a background one); ``ticket`` is the save's place in its helper's call
    order (:class:`~flyte_checkpoint.single.saving.order.CommitOrder`), taken when the save is asked
    for, before anything waits.
    """

    snapshot: Snapshot
    ticket: int
    progress: ProgressCallback | None = None
    asked_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the caller asked for the save."""
    staged_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when its content was fixed (the snapshot taken) and the caller could go on."""
    incremental: bool = False
    """Whether a directory is saved into the destination's chunk store
    (:mod:`flyte_checkpoint.incremental`)."""

    def times(self, background: bool) -> SaveTimes:
        """What this save cost, now that it committed."""
        now = time.monotonic()
        return SaveTimes(
            background=background,
            staged_seconds=(self.staged_at if background else now) - self.asked_at,
            durable_seconds=now - self.asked_at,
            copied_bytes=self.snapshot.copied_bytes,
            committed_at=datetime.datetime.now(datetime.timezone.utc),
        )

    @property
    def content(self) -> bytes | Path:
        """What the upload reads: bytes, or a path (the caller's or the snapshot's own)."""
        return self.snapshot.data

    def discard(self) -> None:
        """Remove what the snapshot made for this save (a private copy), if anything."""
        self.snapshot.discard()


@dataclass(frozen=True)
class SaveTimes:
    """What a committed save cost, split as torch DCP splits it: staged, then durable."""

    background: bool
    """Whether it was a background save."""
    staged_seconds: float
    """How long the save call kept the caller: for a background save, taking the snapshot (hard
    links, plus :attr:`copied_bytes` copied); for a blocking save, the whole save."""
    durable_seconds: float
    """From the call to the commit: when the next attempt could load it."""
    copied_bytes: int
    """Bytes the snapshot copied instead of linking (files seen rewritten in place, files mapped
    shared-writable, another filesystem); 0 for a blocking save."""
    committed_at: datetime.datetime
    """When (UTC) it committed."""
