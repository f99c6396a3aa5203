"""Where an indexed archive's data members lie, read from its index before its members.

An indexed ``.tar.gz`` (:mod:`.members`) ends in a tail that says where its index starts, and
the index lists every data member's length and content size. Where the object can be read at
offsets (:mod:`.positional`), a load reads the index first, so that it knows where each member
starts without reading each member's header on the extracting thread: it then hands a run of
members that lie wholly inside one file to the pool as one job (:mod:`.member_reader`).

The plan is only a hint. Every member a job reads must be the member the plan says, and the
index and tail are still read and checked in order, against the members actually read, at the
end of the load; an object whose tail or index does not parse, or does not add up, has no plan
and is read member by member, which reports what is wrong with it where it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.positional import PositionalReads
from flyte_checkpoint.errors import ArchiveIndexError

LARGEST_INDEX = 64 << 20
"""Bytes of index read ahead, at most (an index lists a data member in 8 bytes: 64 MiB lists
8 million members, 8 TiB of content); a longer one is read in order only."""


@dataclass(frozen=True)
class Planned:
    """A data member the index lists: where it starts, its length, the content it declares."""

    start: int
    length: int
    declared: int


@dataclass(frozen=True)
class Plan:
    """The data members an index lists, in order, and the number of each by where it starts."""

    planned: tuple[Planned, ...]
    numbers: dict[int, int]

    def at(self, start: int) -> int | None:
        """The number of the data member the index says starts at byte ``start``, if any."""
        return self.numbers.get(start)


def read_plan(positional: PositionalReads) -> Plan | None:
    """The plan of the archive ``positional`` reads, or ``None`` where its tail and index do not
    describe data members that fill the archive up to its index."""
    try:
        return _read_plan(positional)
    except ArchiveIndexError:
        return None  # read in order, the same damage is reported where it is


def _read_plan(positional: PositionalReads) -> Plan | None:
    tail_at = positional.size() - members.TAIL_SIZE
    if tail_at <= 0:
        return None
    tail = positional.read_at(tail_at, members.TAIL_SIZE)
    frame = members.frame(tail, tail_at)
    if frame.kind != members.KIND_TAIL or frame.length != len(tail):
        return None
    members.check_fixed(tail, tail_at, frame)
    index_at, count, _ = members.decode_tail(tail)
    if not 0 < index_at < tail_at or tail_at - index_at > LARGEST_INDEX:
        return None
    index = positional.read_at(index_at, tail_at - index_at)
    entries: list[tuple[int, int]] = []
    at = 0
    while at < len(index):
        frame = members.frame(index[at : at + members.HEADER_PREFIX], index_at + at)
        member = index[at : at + frame.length]
        if frame.kind != members.KIND_INDEX or len(member) != frame.length:
            return None
        members.check_fixed(member, index_at + at, frame)
        entries.extend(members.decode_index(member, index_at + at))
        at += frame.length
    if len(entries) != count:
        return None
    planned = []
    start = 0
    for length, declared in entries:
        if not members.data_length_fits(length) or not 0 < declared <= members.BLOCK:
            return None
        planned.append(Planned(start, length, declared))
        start += length
    if start != index_at:
        return None
    return Plan(tuple(planned), {member.start: number for number, member in enumerate(planned)})
