"""File data written by the thread that read it.

Loading stored weights is copies: each member is read (a copy out of the page cache), its
CRC-32 checked, and its content written to a file (a copy into the page cache). When one thread
reads a member and another writes it, every member crosses between threads twice, its buffer is
freed on a thread other than the one that allocated it (which glibc pays for in page faults), and
the bytes are cold in the writing core's cache: measured here, two threads then loaded a GiB of
weights barely faster than one, with half again the CPU.

So the extracting thread, on reaching a file, *routes* the file's data: it tells the reader of
an indexed archive (:mod:`.member_reader`) that the next ``length`` bytes of content go to that
file, through a :class:`Route`. A member queued after that is decoded on the pool by a
thread that also writes the part of its content that falls in the file, right after checking it
(and, where the object can be read at offsets, :mod:`.positional`, after reading it), and hands
on a :class:`Written` piece in its place, which says how many bytes were written and carries
none. Members queued before the route (a few, read ahead of the file's header) are handed on as
bytes and written as before. The extracting thread still sees every byte of the tar stream in
order (headers, padding, and the data of files it writes itself), so every check it makes is
made as before; it only no longer writes the data a pool thread wrote.

Where the object is read at offsets, the members that lie wholly inside the file are
*promised*, a run at a time: a run's :class:`Written` piece is handed on at once, before its
members are even read, and the job that reads, checks and writes them is given to the file
(:meth:`Route.promise`), which is
finished only after every such job is done, and fails with the first that failed. So the
extracting thread runs ahead to the next file's header while the pool still writes this one,
and the pool's threads can write different files at once (:mod:`.lanes`). No byte is written
before its member's CRC-32 is checked, and the stream still accounts for every member in order.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol


class Route(Protocol):
    """Where the data of one file goes (:meth:`.file_writes.FileWrites.route`)."""

    def write(self, pieces: list[memoryview], offset: int) -> None:
        """Put ``pieces``, in order, at ``offset`` of the file. Called on a pool thread; raises
        what the write raised."""
        ...

    def promise(self, job: Future[Any]) -> None:
        """``job`` will write some of the file's data, whose :class:`Written` piece is handed on
        before it has run: the file is finished only once ``job`` is done, and fails with it."""
        ...


class Written:
    """``length`` bytes of a file's data that a pool thread already wrote to the file."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"Written({self.length})"


Piece = bytes | memoryview | Written
"""What a routing reader hands on: bytes of the stream, or file data already written."""


_Views = list[memoryview]


def cut(content: _Views, start: int, end: int) -> tuple[_Views, _Views, _Views]:
    """``content`` (views, in order) split at byte offsets ``start`` and ``end``: the views
    before ``start``, those from ``start`` to ``end``, and those after. No byte is copied."""
    if start == 0 and end >= sum(len(view) for view in content):
        return [], content, []  # the common case, a member wholly inside the file: no slicing
    before: _Views = []
    inside: _Views = []
    after: _Views = []
    at = 0
    for view in content:
        ends = at + len(view)
        if at < start:
            before.append(view[: min(start, ends) - at])
        if ends > start and at < end:
            inside.append(view[max(start - at, 0) : min(end, ends) - at])
        if ends > end:
            after.append(view[max(end - at, 0) :])
        at = ends
    return [v for v in before if v], [v for v in inside if v], [v for v in after if v]
