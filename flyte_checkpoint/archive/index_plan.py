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

import bisect
from array import array
from dataclasses import dataclass

from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.positional import PositionalReads
from flyte_checkpoint.errors import ArchiveIndexError


@dataclass(frozen=True)
class Planned:
    """A data member the index lists: where it starts, its length, the content it declares."""

    start: int
    length: int
    declared: int


class Plan:
    """The data members an index lists, in order (kept as arrays: eight bytes a member)."""

    def __init__(self, starts: array[int], lengths: array[int], last_declared: int) -> None:
        self._starts = starts
        self._lengths = lengths
        self._last_declared = last_declared

    def __len__(self) -> int:
        return len(self._starts)

    def at(self, start: int) -> int | None:
        """The number of the data member the index says starts at byte ``start``, if any."""
        number = bisect.bisect_left(self._starts, start)
        return number if number < len(self._starts) and self._starts[number] == start else None

    def member(self, number: int) -> Planned:
        """The ``number``-th data member the index lists."""
        declared = self._last_declared if number == len(self._starts) - 1 else members.BLOCK
        return Planned(self._starts[number], self._lengths[number], declared)


def read_plan(positional: PositionalReads) -> Plan | None:
    """The plan of the archive ``positional`` reads, or ``None`` where its tail and index do not
    describe data members that fill the archive up to its index, each a whole block of content
    but the last (as the members read in order must be)."""
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
    index_at, count, total = members.decode_tail(tail)
    # Bounded before anything is read: the members fill the bytes before the index, each a
    # whole block but the last, and the index is as long as listing them takes.
    if not 0 < index_at < tail_at or count != -(-total // members.BLOCK):
        return None
    if count * members.SHORTEST_DATA_MEMBER > index_at or tail_at - index_at != members.index_size(count):
        return None
    index = positional.read_at(index_at, tail_at - index_at)
    starts, lengths = array("q"), array("q")
    last_declared = total - (count - 1) * members.BLOCK
    start = at = 0
    while at < len(index):
        frame = members.frame(index[at : at + members.HEADER_PREFIX], index_at + at)
        member = index[at : at + frame.length]
        if frame.kind != members.KIND_INDEX or len(member) != frame.length:
            return None
        members.check_fixed(member, index_at + at, frame)
        for length, declared in members.decode_index(member, index_at + at):
            expected = last_declared if len(starts) == count - 1 else members.BLOCK
            if declared != expected or not members.data_length_fits(length):
                return None
            starts.append(start)
            lengths.append(length)
            start += length
        at += frame.length
    if len(starts) != count or start != index_at:
        return None
    return Plan(starts, lengths, last_declared)
