"""What travels in DCP's plans and is pickled into DCP's metadata: where each item lives, and its digest.

These classes are pickled (plans between ranks, ``Metadata.storage_data`` in the version's controller record),
so their module path and field names are part of the stored format: change them only with a
new format.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARD_SUFFIX = ".distcp"


def shard_name(rank: int) -> str:
    """The object a rank writes its items to, in the save's version directory."""
    return f"shard-{rank:05d}{SHARD_SUFFIX}"


@dataclass(frozen=True)
class SaveTarget:
    """A rank's part of the global save plan: the version every rank writes under, and its object.

    The coordinator picks the version id in ``prepare_global_plan`` and DCP scatters it to every
    rank inside its plan, so all ranks of one save write to the same fresh, invisible directory.
    """

    version_id: str
    object_name: str


@dataclass(frozen=True)
class ItemLocation:
    """Where one saved item (a tensor chunk or a blob) lives, and how to check and decode it.

    ``object_size``/``object_digest`` describe the whole object the item is in; the coordinator
    gathers them into the commit's manifest.
    """

    object_name: str
    offset: int
    length: int
    digest: str
    """The labelled digest (``"crc32:..."``) of this item's bytes, checked before it is used."""
    dtype: str | None
    """The tensor's dtype (``"float32"``), or ``None`` for a blob (``BytesIO``) item."""
    shape: tuple[int, ...] | None
    object_size: int
    object_digest: str


@dataclass(frozen=True)
class LoadSource:
    """A rank's local load plan names the version its metadata came from, so the coordinator can
    refuse a load in which ranks read different committed versions (a save committed meanwhile)."""

    version_id: str
