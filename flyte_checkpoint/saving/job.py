"""One save of a helper, fixed when it is asked for: what is uploaded, its place in the order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.saving.snapshot import Snapshot


@dataclass(frozen=True)
class SaveJob:
    """A save as the caller asked for it, built once and never changed after.

    ``snapshot`` holds what is uploaded (the caller's bytes or path for a blocking save, a
    private copy for a background one); ``ticket`` is the save's place in its helper's call
    order (:class:`~flyte_checkpoint.saving.order.CommitOrder`), taken when the save is asked
    for, before anything waits.
    """

    snapshot: Snapshot
    ticket: int
    progress: ProgressCallback | None = None

    @property
    def content(self) -> bytes | Path:
        """What the upload reads: bytes, or a path (the caller's or the snapshot's own)."""
        return self.snapshot.data

    def discard(self) -> None:
        """Remove what the snapshot made for this save (a private copy), if anything."""
        self.snapshot.discard()
