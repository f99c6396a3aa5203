"""Reading an indexed ``.tar.gz``: members inflated on a pool of threads, read back in order.

The caller's thread reads the object as a stream (so the store's digest still covers every
byte), splits it into members by the lengths their headers declare, hands each data member to
the pool to be checked and inflated, and returns the blocks in order, at most ``threads + 1``
members ahead. Where the stream can also be read at offsets (a local file,
:mod:`.positional`), the caller's thread reads only each member's header and the pool reads
the member itself: that read, a copy of every byte, was most of the serial work of loading
stored weights. The stream then skips each member as it is handed on, with the CRC-32 the pool
computed, so its digest still covers every byte, in order. A stored member laid out as this
package writes one is not copied at all: its content is handed on as views of the member as
read, once the pool has checked its CRC-32. Either way the extraction routes each file's data
(:mod:`.routing`): the pool thread that checked a member writes the part of it that is the
file's, and hands on a :class:`~.routing.Written` piece in its place. Read at offsets, the
index is read first (:mod:`.index_plan`), and the members it lists wholly inside a file are
promised to it in runs: one :class:`~.routing.Written` piece is handed on for a run before any
of it is read, and one job reads, checks and writes the run, waiting in the file's lane
(:mod:`.lanes`). So the caller's thread neither reads those members' headers nor hands their
jobs over one by one; it goes on to the next file while the pool writes this one, and the
pool's threads write different files at once. Every member is still skipped in order, once
done, with the bytes behind what was handed on counted when it is queued
(:meth:`~.positional.PositionalReads.reserve`); each member of a run must be the one the index
lists, and the index and tail are still checked in order against the members read. The
extraction that consumes the blocks is the same as the streaming path's, with every safety
check it makes.

Nothing in the object is trusted: each member must inflate to exactly the size it declares,
with its CRC-32; the index members and the tail must agree with the data members actually read
(count, each length, the total, where the index starts), and nothing may follow the tail. A
disagreement raises :class:`~flyte_checkpoint.errors.ArchiveIndexError` naming it; a stream that
stops early raises :class:`~flyte_checkpoint.errors.CheckpointCorruptError`.
"""

from __future__ import annotations

import functools
import io
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO

from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.index_plan import Plan, Planned, read_plan
from flyte_checkpoint.archive.lanes import Lanes
from flyte_checkpoint.archive.positional import PositionalReads, positional_reads
from flyte_checkpoint.archive.routing import Piece, Route, Written, cut
from flyte_checkpoint.errors import ArchiveIndexError, CheckpointCorruptError

THREAD_PREFIX = "flyte-checkpoint-gunzip"

_Content = bytes | list[memoryview] | list[Piece]
_Skips = tuple[tuple[int, int], ...]
"""Bytes read at their offsets, as (length, CRC-32) in order, for the stream to skip."""
_Routed = tuple[int, int, Route, int]
"""The part of a member's content that a route writes: from, to, the route, its file offset."""
_Routing = Callable[[], _Routed | None]
"""What a job writes of its member's content (:data:`_Routed`), asked once it is decoded."""


class _Member:
    """A member as decoded: its content, handed on once, and what the stream skips for it."""

    __slots__ = ("_content", "skips")

    def __init__(self, content: _Content, skips: _Skips = ()) -> None:
        self._content = content
        self.skips = skips

    def take(self) -> _Content:
        """The content, which this member then no longer holds: it stays queued until the
        stream has skipped it, which waits for every member before it, and the extracting
        thread may be a long way ahead of a promised job that waits (as many files as it keeps
        open, each with the members read ahead of its header)."""
        content, self._content = self._content, b""
        return content


RUN = 8
"""Members of a file that one promised job reads, checks and writes, at most, where the index
was read first (:mod:`.index_plan`): a job handed between threads costs both of them (a future,
a wake-up, the stream's accounting), so a file's members go in runs; 8 MiB keeps two lanes'
jobs small beside a file of 100 MiB."""

TAR_BLOCK = 512
"""Bytes of a tar block: a file's data is padded to a whole one, and a header is one."""

UNSETTLED = 4096
"""Members queued but not yet accounted for in the stream, at most. Most are promised ones
(:mod:`.routing`), which hold a future each until a thread reads them."""


class IndexedReader(io.RawIOBase):
    """The content of the indexed archive ``source``, whose first bytes ``head`` were read already.

    Members inflate on ``pool`` when one is given (the caller's to shut down), else on a pool of
    ``threads`` of its own, or on the reading thread when ``threads`` is 1.
    """

    def __init__(self, source: IO[bytes], head: bytes, threads: int, pool: Lanes | None = None) -> None:
        self._source = source
        self._head = head
        self._offset = 0
        self._own_pool: Lanes | None = None
        self._pool = pool
        parallel = pool is not None or threads > 1
        # Read at offsets only where the stream's offsets are the archive's: ``head`` is all it
        # has consumed. The first member is read in order, the rest at their offsets.
        found = positional_reads(source) if parallel else None
        self._positional = found if found is not None and found.consumed() == len(head) else None
        self._plan: Plan | None = None if self._positional is None else read_plan(self._positional)
        self._ahead = threads + 1
        # What to hand on, in order, at most ``_ahead`` members; and every member queued, in
        # order, until the stream has skipped it (a promised member is handed on at once, and
        # stays only here until it has run).
        self._pending: deque[Future[_Member] | _Member] = deque()
        self._unsettled: deque[Future[_Member] | _Member] = deque()
        self._pieces: deque[Piece] = deque()
        self._handed_on = 0  # bytes of content handed on by read_view
        self._queued_content = 0  # bytes of content of the data members queued
        self._route: tuple[int, int, Route] | None = None
        self._seen: list[tuple[int, int]] = []
        self._listed: list[tuple[int, int]] = []
        self._index_offset: int | None = None
        self._done = False
        self._ended = False
        if pool is None and threads > 1:  # last: a reader that fails to be made is never closed
            self._own_pool = self._pool = Lanes(threads, THREAD_PREFIX)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = _readable(self.read_view(len(memoryview(buffer).cast("B"))))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (a whole inflated block without copying it when it fits)."""
        data = _readable(self.read_view(-1 if size is None else size))
        return data if isinstance(data, bytes) else bytes(data)

    def route(self, length: int, route: Route) -> None:
        """The next ``length`` bytes of content are a file's data, to be written through
        ``route`` by the pool threads that decode them (:mod:`.routing`); :meth:`read_view`
        hands on what they wrote, or will write, as :class:`~.routing.Written` pieces. Without
        a pool (one thread), every byte is handed on as before."""
        if self._pool is not None and length:
            self._route = (self._handed_on, self._handed_on + length, route)

    def read_view(self, size: int = -1) -> Piece:
        """Up to ``size`` bytes as the archive holds them, without copying: a whole inflated
        block, or a view of one, or of a stored member's content, or a :class:`~.routing.Written`
        piece for routed file data; ``b""`` at the end."""
        piece = self._next_piece(size)
        self._handed_on += len(piece)
        return piece

    def _next_piece(self, size: int) -> Piece:
        while not self._pieces:
            self._fill()
            if not self._pending:
                if self._unsettled:  # as many queued as may be: wait for the oldest
                    self._settle_next()
                    continue
                self._end_of_stream()
                return b""
            item = self._pending.popleft()
            content = (item.result() if isinstance(item, Future) else item).take()
            self._settle_ready()
            if content:
                self._pieces.extend(content if isinstance(content, list) else (content,))
        piece = self._pieces[0]
        if size < 0 or size >= len(piece):
            return self._pieces.popleft()
        if isinstance(piece, Written):
            self._pieces[0] = Written(len(piece) - size)
            return Written(size)
        view = memoryview(piece)
        self._pieces[0] = view[size:]
        return view[:size]

    def close(self) -> None:
        for item in (*self._pending, *self._unsettled):
            if isinstance(item, Future):
                item.cancel()
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._unsettled.clear()
        self._pieces.clear()
        super().close()

    def _fill(self) -> None:
        while not self._done and len(self._pending) < self._ahead and len(self._unsettled) < UNSETTLED:
            if self._waits_for_route():
                return
            self._next_member()

    def _waits_for_route(self) -> bool:
        """Whether to queue no stored member past the header that follows a file of a MiB or
        more until the extraction routes that header's file (while it has something to read):
        a member queued before its file is routed is decoded and handed on as bytes, which the
        extracting thread then waits for, where once routed it would have been promised. Only
        a stored member waits: checking one is cheap, where inflating a deflated one is what
        reading ahead is for (on a tree of 1 MiB text files, over a quarter of the load's time)."""
        if self._plan is None or self._route is None or not self._pending:
            return False
        start, end, _ = self._route
        next_header = -(-end // TAR_BLOCK) * TAR_BLOCK
        if end - start < members.BLOCK or self._queued_content <= next_header:
            return False
        number = self._plan.at(self._offset)
        return number is not None and _stored_size(self._plan.member(number))

    def _queue(self, member: Future[_Member] | _Member, handed_on: _Member | None = None) -> None:
        """Queue ``member`` to be skipped by the stream in order, and to be handed on, or
        ``handed_on`` in its place (a promised member's :class:`~.routing.Written` piece)."""
        self._unsettled.append(member)
        self._pending.append(member if handed_on is None else handed_on)

    def _settle_ready(self) -> None:
        """Skip, in order, the members at the front of the queue that are done (raising the
        error of one that failed)."""
        while self._unsettled and not _running(self._unsettled[0]):
            self._settle_next()

    def _settle_next(self) -> None:
        """Wait for the oldest member queued, and skip it in the stream."""
        item = self._unsettled.popleft()
        for length, crc in (item.result() if isinstance(item, Future) else item).skips:
            self._skip(length, crc)

    def _read(self, size: int) -> bytes:
        """Up to ``size`` bytes, fewer only at the end of the object."""
        parts = []
        if self._head:
            parts.append(self._head[:size])
            self._head = self._head[size:]
            size -= len(parts[0])
        while size > 0 and (data := self._source.read(size)):
            parts.append(data)
            size -= len(data)
        data = b"".join(parts)
        self._offset += len(data)
        return data

    def _read_exact(self, size: int, what: str) -> bytes:
        data = self._read(size)
        if len(data) < size:
            raise _truncated(self._offset, what)
        return data

    def _read_at(self, positional: PositionalReads, offset: int, size: int, what: str) -> bytes:
        data = positional.read_at(offset, size)
        if len(data) < size:
            raise _truncated(offset + len(data), what)
        return data

    def _at_offsets(self) -> PositionalReads | None:
        """What to read the next member with at its offset; ``None`` while it is read in order
        (the first member, whose header was read in order before this reader was made)."""
        return None if self._head else self._positional

    def _skip(self, length: int, crc: int) -> None:
        if self._positional is not None:
            self._positional.skip(length, crc)

    def _next_member(self) -> None:
        start = self._offset
        positional = self._at_offsets()
        if positional is not None and self._queue_planned(positional, start):
            return
        if positional is None:
            head = self._read(members.HEADER_PREFIX)
        else:
            head = positional.read_at(start, members.DATA_HEADER)
        if len(head) < members.HEADER_PREFIX and positional is not None:
            self._settle()  # where the object ends inside a member read at its offset, say so
        if not head:
            raise CheckpointCorruptError(
                f"damaged archive: it ends at byte {start} after {len(self._seen)} data members, "
                "before the end of its index: the object is truncated"
            )
        if len(head) < members.HEADER_PREFIX:
            raise _truncated(start + len(head), "a member header")
        frame = members.frame(head, start)
        what = f"the member that starts at byte {start}"
        if positional is not None:
            positional.reserve(frame.length)
            self._offset = start + frame.length
            if frame.kind == members.KIND_DATA:
                if len(head) < members.DATA_HEADER:
                    raise _truncated(start + len(head), what)
                head_crc = members.crc32(head[: members.HEADER_PREFIX])
                job = functools.partial(self._read_member_at, positional, start, frame, head_crc, what)
                declared = members.declared_size(head[members.HEADER_PREFIX :], start)
                self._data(declared, start, frame.length, job)
                return
            member = self._read_at(positional, start, frame.length, what)
            skips: _Skips = ((frame.length, members.crc32(member)),)
        else:
            rest = self._read_exact(frame.length - len(head), what)
            if frame.kind == members.KIND_DATA:
                job = functools.partial(_decoded, rest, start, frame)
                self._data(members.declared_size(rest, start), start, frame.length, job)
                return
            member, skips = head + rest, ()
        members.check_fixed(member, start, frame)
        if frame.kind == members.KIND_INDEX:
            if self._index_offset is None:
                self._index_offset = start
            self._listed.extend(members.decode_index(member, start))
            if len(self._listed) > len(self._seen):
                raise ArchiveIndexError(
                    f"damaged archive: its index lists {len(self._listed)} data members by byte "
                    f"{self._offset}, but it holds {len(self._seen)}"
                )
            self._queue(_Member(b"", skips))
        else:
            self._tail(member, start)
            self._queue(_Member(bytes(members.TAIL_CONTENT), skips))

    def _settle(self) -> None:
        """Wait for the members queued, raising the first one's error, if any."""
        for item in self._unsettled:
            if isinstance(item, Future):
                item.result()

    def _data(self, declared: int, start: int, length: int, job: Callable[..., _Member]) -> None:
        """Queue the data member at ``start``, of ``length`` bytes declaring ``declared`` bytes of
        content, to be decoded by ``job`` on the pool, and to write what a route holds of it
        (``job`` takes ``routing``)."""
        if self._index_offset is not None:
            raise ArchiveIndexError(f"damaged archive: a data member follows the index, at byte {start}")
        # Only the last member may be short, so the members too are bounded by the content.
        if self._seen and self._seen[-1][1] != members.BLOCK:
            if self._unsettled and isinstance(previous := self._unsettled[-1], Future):
                previous.result()  # a short member that does not even decode: that says more
            raise ArchiveIndexError(
                f"damaged archive: the data member at byte {start} follows one of {self._seen[-1][1]} "
                f"bytes; only the last may be shorter than {members.BLOCK}"
            )
        self._seen.append((length, declared))
        begins = self._queued_content
        self._queued_content += declared
        routed = self._routed(begins, declared)
        if self._pool is None:
            self._queue(job(routing=lambda: routed))
        else:
            # Handed on only once done, so no later route can replace the one that holds it
            # while it runs: asked then, it also finds a route set after it was queued (the
            # header of its file was in a member before it).
            routing = functools.partial(self._routed, begins, declared)
            self._queue(self._pool.submit(job, routing=routing))

    def _queue_planned(self, positional: PositionalReads, start: int) -> bool:
        """Queue the data member the index lists at ``start``, if any, without reading its
        header here: with those after it that lie wholly inside the route, as a promised run
        (:meth:`_promise_run`), else alone, read and checked on the pool. ``False`` where the
        index lists none there (the member is then read as any other, and whatever is wrong
        with it reported)."""
        number = None if self._plan is None else self._plan.at(start)
        if number is None or self._plan is None or self._pool is None or self._index_offset is not None:
            return False
        if self._promise_run(positional, start, number):
            return True
        planned = self._plan.member(number)
        positional.reserve(planned.length)
        self._offset = start + planned.length
        job = functools.partial(self._read_planned, positional, planned)
        self._data(planned.declared, start, planned.length, job)
        return True

    def _promise_run(self, positional: PositionalReads, start: int, number: int) -> bool:
        """Promise the members from ``start`` (the ``number``-th data member) that the index
        lists wholly inside the route, at most :data:`RUN`, to one job; ``False`` when there
        is none."""
        if self._plan is None or self._pool is None or self._route is None:
            return False
        route_start, route_end, route = self._route
        begins = self._queued_content
        if begins < route_start:
            return False
        run: list[Planned] = []
        ends = begins
        previous = self._seen[-1][1] if self._seen else members.BLOCK
        for planned in map(self._plan.member, range(number, min(number + RUN, len(self._plan)))):
            # Only whole blocks: a short member followed by any other is an error that the
            # member-by-member path reports.
            if previous != members.BLOCK or ends + planned.declared > route_end:
                break
            run.append(planned)
            ends += planned.declared
            previous = planned.declared
        if not run:
            return False
        length = sum(planned.length for planned in run)
        positional.reserve(length)
        self._offset = start + length
        self._seen.extend((planned.length, planned.declared) for planned in run)
        self._queued_content = ends
        job = functools.partial(self._read_run, positional, tuple(run), route, begins - route_start)
        promised = self._pool.submit_to(route, job)
        route.promise(promised)
        written: list[Piece] = [Written(ends - begins)]
        self._queue(promised, handed_on=_Member(written))
        return True

    def _read_run(
        self, positional: PositionalReads, run: tuple[Planned, ...], route: Route, file_offset: int
    ) -> _Member:
        """On the pool: the data members ``run`` lists read at their offsets, each checked to be
        what the index says it is, decoded, and written through ``route`` from ``file_offset``
        on; skipped as one span."""
        crc = 0
        for planned in run:
            member, frame = self._read_listed(positional, planned)
            rest = memoryview(member)[members.HEADER_PREFIX :]
            content = members.decode_member(rest, planned.start, frame)
            route.write([memoryview(content)] if isinstance(content, bytes) else content, file_offset)
            file_offset += planned.declared
            crc = members.crc32(member, crc)
        return _Member([], ((run[-1].start + run[-1].length - run[0].start, crc),))

    def _read_planned(self, positional: PositionalReads, planned: Planned, routing: _Routing) -> _Member:
        """On the pool: the data member ``planned`` read at its offset, checked to be what the
        index says it is, and decoded; the part ``routing`` names written to its file, and
        handed on as written."""
        member, frame = self._read_listed(positional, planned)
        skips = ((planned.length, members.crc32(member)),)
        return _decoded(memoryview(member)[members.HEADER_PREFIX :], planned.start, frame, routing, skips)

    def _read_listed(self, positional: PositionalReads, planned: Planned) -> tuple[bytes, members.Frame]:
        """The data member ``planned``, read at its offset, and its frame, once checked to be
        what the index lists."""
        start = planned.start
        member = self._read_at(positional, start, planned.length, f"the member that starts at byte {start}")
        frame = members.frame(member, start)
        if frame.kind != members.KIND_DATA:
            found = "is not a data member"
        else:
            declared = members.declared_size(memoryview(member)[members.HEADER_PREFIX :], start)
            found = f"is {frame.length} bytes unpacking to {declared}"
            if (frame.length, declared) == (planned.length, planned.declared):
                return member, frame
        raise ArchiveIndexError(
            f"damaged archive: its index lists a data member of {planned.length} bytes unpacking "
            f"to {planned.declared} at byte {start}, but the member there {found}"
        )

    def _routed(self, begins: int, size: int) -> _Routed | None:
        """What the route holds of the ``size`` bytes of content from ``begins``, if any."""
        route = self._route  # read once: the extracting thread replaces it, on any thread
        if route is None:
            return None
        start, end, target = route
        low, high = max(start, begins), min(end, begins + size)
        return (low - begins, high - begins, target, low - start) if low < high else None

    def _read_member_at(
        self,
        positional: PositionalReads,
        start: int,
        frame: members.Frame,
        head_crc: int,
        what: str,
        routing: _Routing,
    ) -> _Member:
        """On the pool: the rest of the data member at ``start`` (``what``), read there and
        decoded; the part ``routing`` names written to its file, and handed on as written."""
        rest_at = start + members.HEADER_PREFIX
        rest = self._read_at(positional, rest_at, frame.length - members.HEADER_PREFIX, what)
        skips = ((members.HEADER_PREFIX + len(rest), members.crc32(rest, head_crc)),)
        return _decoded(rest, start, frame, routing, skips)

    def _tail(self, member: bytes, start: int) -> None:
        index_offset, count, total = members.decode_tail(member)
        found = start if self._index_offset is None else self._index_offset
        problem = None
        if index_offset != found:
            problem = f"its tail says the index starts at byte {index_offset}, it starts at {found}"
        elif not count == len(self._listed) == len(self._seen):
            problem = (
                f"its tail counts {count} data members and its index lists {len(self._listed)}, "
                f"but it holds {len(self._seen)}"
            )
        elif total != (unpacked := sum(size for _, size in self._seen)):
            problem = f"its tail says it unpacks to {total} bytes, its members to {unpacked}"
        else:
            for number, (listed, seen) in enumerate(zip(self._listed, self._seen, strict=True)):
                if listed != seen:
                    problem = (
                        f"its index lists data member {number} as {listed[0]} bytes unpacking to "
                        f"{listed[1]}, but it is {seen[0]} bytes unpacking to {seen[1]}"
                    )
                    break
        if problem is None and self._follows_tail():
            problem = f"bytes follow its tail member (at byte {self._offset})"
        if problem is not None:
            raise ArchiveIndexError(f"damaged archive: {problem}")
        self._done = True

    def _follows_tail(self) -> bool:
        """Whether the object goes on after its tail (read in order, this reaches the stream's
        end, which makes it check its digest; read at offsets, :meth:`_end_of_stream` does)."""
        positional = self._at_offsets()
        if positional is None:
            if self._read(1):
                self._offset -= 1  # the error names where the extra bytes start
                return True
            self._ended = True
            return False
        return bool(positional.read_at(self._offset, 1))

    def _end_of_stream(self) -> None:
        """Once every member was handed on: read the stream's end, after skipping what was read
        at offsets, so the stream checks its size and digest."""
        if self._ended or not self._done:
            return
        self._ended = True
        if self._source.read(1):
            raise ArchiveIndexError(f"damaged archive: bytes follow its tail member (at byte {self._offset})")


def _stored_size(planned: Planned) -> bool:
    """Whether the member ``planned`` is as long as its content, as a stored one is (a
    deflated one is shorter)."""
    return planned.length > planned.declared


def _running(item: Future[_Member] | _Member) -> bool:
    return isinstance(item, Future) and not item.done()


def _readable(piece: Piece) -> bytes | memoryview:
    if isinstance(piece, Written):
        raise RuntimeError("routed file data was read as bytes: only read_view hands it on")
    return piece


def _decoded(
    rest: bytes | memoryview, start: int, frame: members.Frame, routing: _Routing, skips: _Skips = ()
) -> _Member:
    """On the pool: the data member at ``start`` decoded, and the part ``routing`` names written
    to its file once checked, to be handed on as written."""
    content = members.decode_member(rest, start, frame)
    routed = routing()
    if routed is None:
        return _Member(content, skips)
    low, high, route, file_offset = routed
    views = [memoryview(content)] if isinstance(content, bytes) else content
    before, inside, after = cut(views, low, high)
    route.write(inside, file_offset)
    handed_on: list[Piece] = [*before, Written(high - low), *after]
    return _Member(handed_on, skips)


def _truncated(at: int, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"damaged archive: it ends at byte {at}, inside {what}: the object is truncated"
    )
