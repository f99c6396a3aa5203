"""A load on several threads has the pool thread that checked a member write the file data it
holds (:mod:`flyte_checkpoint.archive.routing`): the same tree comes back, with its holes, every
byte accounted for in order, nothing written before it is checked, and nothing left open or
running when a write fails; whether the object is read in order (an object store's stream) or
at offsets (a local file).

The archives are real ones written by :func:`archive.pack_directory`, read from memory; the only
fault injected is a full disk on a pool thread (``os.pwritev`` raising ENOSPC), which a real disk
cannot be made to produce on demand part-way through one file.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import struct
import threading
import tracemalloc
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, cast

import pytest

from flyte_checkpoint import ArchiveIndexError, archive
from flyte_checkpoint.archive import extract, file_writes, member_reader, members
from flyte_checkpoint.archive.limits import CountingReader
from flyte_checkpoint.archive.routing import Route, Written, cut
from tests.archive.sources import ReadableAtOffsets
from tests.conftest import tree_of

MIB = 1 << 20


def packed(source: Path) -> bytes:
    sink = io.BytesIO()
    archive.pack_directory(source, sink)
    return sink.getvalue()


def weights_tree(root: Path) -> Path:
    """Files of several MiB whose data start and end off member boundaries, between small ones."""
    root.mkdir()
    (root / "a.json").write_text('{"step": 7}')
    for number in range(3):
        (root / f"shard-{number}.bin").write_bytes(os.urandom(6 * MIB + 12_345 * number))
        (root / f"note-{number}.txt").write_bytes(b"x" * (777 + number))
    os.chmod(root / "shard-1.bin", 0o640)
    os.utime(root / "shard-2.bin", (1_600_000_000, 1_600_000_000))
    return root


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def loading_threads() -> list[str]:
    prefixes = (extract.THREAD_PREFIX, member_reader.THREAD_PREFIX)
    return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]


Opener = Callable[[bytes], IO[bytes]]


@pytest.fixture(params=["read in order", "read at offsets"])
def opened(request: pytest.FixtureRequest) -> Opener:
    return io.BytesIO if request.param == "read in order" else ReadableAtOffsets


def watch_routed_writes(
    monkeypatch: pytest.MonkeyPatch, before_write: Callable[[list[memoryview], int], None]
) -> None:
    """Every file write of a load calls ``before_write(pieces, offset)`` first, on its thread."""
    real = file_writes.FileWrites.route

    class Watched:
        def __init__(self, route: Route) -> None:
            self.route = route

        def write(self, pieces: list[memoryview], offset: int) -> None:
            before_write(pieces, offset)
            self.route.write(pieces, offset)

        def promise(self, job: Future[Any]) -> None:
            self.route.promise(job)

    def watched(self: file_writes.FileWrites, file: file_writes.OpenFile) -> Route:
        return Watched(real(self, file))

    monkeypatch.setattr(file_writes.FileWrites, "route", watched)


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Bytes of file data written by the threads that checked them, by thread name."""
    written: dict[str, int] = {}

    def record(pieces: list[memoryview], offset: int) -> None:
        name = threading.current_thread().name
        written[name] = written.get(name, 0) + sum(len(piece) for piece in pieces)

    watch_routed_writes(monkeypatch, record)
    return written


def test_pool_threads_write_the_files_they_check_and_the_tree_is_the_one_saved(
    tmp_path: Path, routed: dict[str, int], opened: Opener
) -> None:
    source = weights_tree(tmp_path / "source")
    archive.unpack_archive(opened(packed(source)), tmp_path / "restored", threads=2)
    assert tree_of(tmp_path / "restored") == tree_of(source)
    assert all(name.startswith(extract.THREAD_PREFIX) for name in routed)
    # All but the members queued before each file's header was read: up to threads + 1 = 3 MiB
    # of each 6 MiB file.
    assert sum(routed.values()) >= 3 * (6 - 3) * MIB


def test_an_object_read_at_offsets_is_accounted_for_in_order_when_pool_threads_write(
    tmp_path: Path,
) -> None:
    data = ReadableAtOffsets(packed(weights_tree(tmp_path / "source")))
    archive.unpack_archive(data, tmp_path / "restored", threads=2)
    assert data.accounted_for


def test_files_written_by_pool_threads_keep_their_mode_and_mtime(tmp_path: Path, opened: Opener) -> None:
    source = weights_tree(tmp_path / "source")
    archive.unpack_archive(opened(packed(source)), tmp_path / "restored", threads=2)
    for name in ("shard-1.bin", "shard-2.bin"):
        before, after = os.stat(source / name), os.stat(tmp_path / "restored" / name)
        assert (after.st_mode & 0o777, int(after.st_mtime)) == (before.st_mode & 0o777, int(before.st_mtime))


def test_zeros_written_by_pool_threads_come_back_as_holes(tmp_path: Path, opened: Opener) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_bytes(b"x" * 777)
    with open(source / "zeros.bin", "wb") as out:
        out.write(b"head")
        out.seek(20 * MIB)
        out.write(os.urandom(MIB))
        out.truncate(40 * MIB)
    restored = tmp_path / "restored"
    archive.unpack_archive(opened(packed(source)), restored, threads=2)
    assert (restored / "zeros.bin").read_bytes() == (source / "zeros.bin").read_bytes()
    assert os.stat(restored / "zeros.bin").st_blocks * 512 < 8 * MIB


def test_a_damaged_member_inside_a_file_is_refused_and_its_bytes_are_not_written(
    tmp_path: Path, opened: Opener
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(12 * MIB))
    data = bytearray(packed(source))
    weights = (source / "weights.bin").read_bytes()
    data_start = gzip.decompress(bytes(data)).find(weights[:64])  # where the file's data begins
    # A byte of content in the ninth data member, well inside the routed part of the file.
    starts = [0]
    while len(starts) < 9:
        head = bytes(data[starts[-1] : starts[-1] + members.HEADER_PREFIX])
        starts.append(starts[-1] + members.frame(head, starts[-1]).length)
    damaged_at = starts[8] + 1000
    data[damaged_at] ^= 0xFF
    with pytest.raises(ArchiveIndexError, match="fails its CRC-32"):
        archive.unpack_archive(opened(bytes(data)), tmp_path / "restored", threads=2)
    restored = (tmp_path / "restored" / "weights.bin").read_bytes()
    damaged = slice(8 * MIB - data_start, 9 * MIB - data_start)  # the ninth member's content
    assert restored[damaged] != weights[damaged]


def test_a_full_disk_on_a_pool_thread_is_raised_and_leaves_nothing_open_or_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opened: Opener
) -> None:
    data = packed(weights_tree(tmp_path / "source"))
    real_pwritev = os.pwritev
    pool_writes = 0

    def pwritev_until_full(fd: int, parts: list[memoryview], offset: int) -> int:
        nonlocal pool_writes
        if threading.current_thread().name.startswith(extract.THREAD_PREFIX):
            pool_writes += 1
            if pool_writes > 4:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwritev(fd, parts, offset)

    monkeypatch.setattr(os, "pwritev", pwritev_until_full)
    before = open_descriptors()
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)) as raised:
        archive.unpack_archive(opened(data), tmp_path / "restored", threads=2)
    assert raised.value.errno == errno.ENOSPC
    assert open_descriptors() <= before
    assert loading_threads() == []


def test_a_routed_write_that_comes_after_its_file_was_abandoned_is_refused(tmp_path: Path) -> None:
    writes = file_writes.FileWrites(None, 1)
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o600)
    file = writes.start(fd, 10, 0o600, 0.0)
    route = writes.route(file)
    writes.abandon()
    with pytest.raises(RuntimeError, match="closed"):
        route.write([memoryview(b"late")], 0)
    assert (tmp_path / "file").read_bytes() == b""


def test_written_pieces_are_skipped_by_the_extracting_threads_writes(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, b"--------", 0)
    with file_writes.FileWrites(None, 1) as writes:
        file = writes.start(fd, 8, 0o600, 0.0)
        writes.write(file, [b"ab", Written(3), memoryview(b"cde")], 0)
        writes.end(file)
    assert (tmp_path / "file").read_bytes() == b"ab---cde"


class Gated:
    """A route whose writes from file offset ``held_from`` on wait for :attr:`gate`; it counts
    those that finished."""

    def __init__(self, held_from: int) -> None:
        self.held_from = held_from
        self.gate = threading.Event()
        self.finished = 0
        self.promised: list[Future[Any]] = []

    def write(self, pieces: list[memoryview], offset: int) -> None:
        if offset >= self.held_from:
            assert self.gate.wait(10)
            self.finished += 1

    def promise(self, job: Future[Any]) -> None:
        self.promised.append(job)


def test_members_wholly_inside_a_file_are_handed_on_as_written_before_a_thread_reads_them(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(8 * MIB))
    counted = CountingReader(ReadableAtOffsets(packed(source)))
    head = counted.read(members.HEADER_PREFIX)
    # Members 0 to 2 are queued before the route (they may still be written through it, when
    # not yet decoded); 3 to 7, queued after it, lie wholly in the file, from its offset 3 MiB - 512.
    route = Gated(held_from=3 * MIB - 512)
    with member_reader.IndexedReader(cast(IO[bytes], counted), head, threads=2) as reader:
        handed_on = len(reader.read(512))  # the file's tar header
        reader.route(8 * MIB, route)
        written = 0
        while handed_on < 8 * MIB:  # to the end of member 7
            piece = reader.read_view(MIB)
            written += len(piece) if isinstance(piece, Written) else 0
            handed_on += len(piece)
            # The expansion bound sees the compressed bytes behind all that was handed on.
            assert counted.count >= handed_on
        assert handed_on == 8 * MIB
        assert (route.finished, len(route.promised)) == (0, 1)  # one job for the run of 3 to 7
        assert written >= 5 * MIB
        route.gate.set()
        while reader.read_view(MIB):
            pass
    assert all(job.done() and job.exception() is None for job in route.promised)


def test_a_files_members_are_promised_in_runs_of_at_most_eight(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(20 * MIB))
    data = packed(source)
    route = Gated(held_from=1 << 60)  # never held
    readable = ReadableAtOffsets(data)
    head = readable.read(members.HEADER_PREFIX)
    with member_reader.IndexedReader(readable, head, threads=2) as reader:
        reader.read(512)
        reader.route(20 * MIB, route)
        while reader.read_view(MIB):
            pass
    # Members 0 to 2 are queued before the route; 3 to 19 lie wholly in the file: 8 + 8 + 1.
    assert len(route.promised) == 3
    assert all(job.done() and job.exception() is None for job in route.promised)


def queued_after_first_file(tmp_path: Path, content: Callable[[int], bytes]) -> tuple[int, int]:
    """Two 6 MiB files of ``content``: the bytes of the object queued (read or reserved) once the
    first file and the second's header were read, before the second is routed; and where the
    member after the one holding that header starts."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("a.bin", "b.bin"):
        (source / name).write_bytes(content(6 * MIB))
    data = packed(source)
    readable = ReadableAtOffsets(data)
    head = readable.read(members.HEADER_PREFIX)
    with member_reader.IndexedReader(readable, head, threads=2) as reader:
        reader.read(512)
        reader.route(6 * MIB, Gated(held_from=1 << 60))
        handed_on = 0
        while handed_on < 6 * MIB:
            handed_on += len(reader.read_view(6 * MIB - handed_on))
        assert len(reader.read(512)) == 512  # the second file's header
        queued = readable.read_in_order + readable.reserved
    holding_header = (6 * MIB + 512) // members.BLOCK
    return queued, split_members(data)[holding_header + 1][0]


def split_members(data: bytes) -> list[tuple[int, int]]:
    found, offset = [], 0
    while offset < len(data):
        length = members.frame(data[offset : offset + members.HEADER_PREFIX], offset).length
        found.append((offset, length))
        offset += length
    return found


def test_stored_members_past_a_large_file_wait_for_the_next_file_to_be_routed(tmp_path: Path) -> None:
    # Queued before the second file is routed, they would be handed on once decoded, and the
    # extracting thread would wait for them; queued after, they are promised.
    queued, next_member = queued_after_first_file(tmp_path, os.urandom)
    assert queued <= next_member


def test_deflated_members_past_a_large_file_are_still_read_ahead(tmp_path: Path) -> None:
    queued, next_member = queued_after_first_file(tmp_path, lambda size: b"step 1 loss 0.5\n" * (size // 16))
    assert queued > next_member


def test_an_index_that_lists_a_member_at_another_length_fails_the_job_that_reads_it(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(6 * MIB))
    data = bytearray(packed(source))
    index_at = members.decode_tail(bytes(data[-members.TAIL_SIZE :]))[0]
    # The index's entries (length, content) start after its member's header and entry count;
    # members 4 and 5 (read in a run: 0 to 2 are read ahead of the file's header) are listed 5
    # bytes longer and shorter: the index still adds up.
    entries = index_at + members.DATA_HEADER
    for number, change in ((4, 5), (5, -5)):
        length, content = struct.unpack_from("<II", data, entries + 8 * number)
        struct.pack_into("<II", data, entries + 8 * number, length + change, content)
    with pytest.raises(ArchiveIndexError, match=r"lists a data member of \d+ bytes .* member there is"):
        archive.unpack_archive(ReadableAtOffsets(bytes(data)), tmp_path / "out", threads=2)


def test_a_file_is_finished_only_once_the_jobs_promised_to_it_are_done(tmp_path: Path) -> None:
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with file_writes.FileWrites(None, 1) as writes:
        file = writes.start(fd, 4, 0o640, 1_600_000_000.0)
        route, promised = writes.route(file), Future[None]()
        route.promise(promised)
        writes.end(file)
        assert os.stat(path).st_mode & 0o777 == 0o600  # not finished: the job is not done
        route.write([memoryview(b"data")], 0)
        promised.set_result(None)
    after = os.stat(path)
    assert (after.st_mode & 0o777, after.st_mtime, path.read_bytes()) == (0o640, 1_600_000_000.0, b"data")


def test_a_load_fails_with_a_job_promised_to_one_of_its_files(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o600)
    writes = file_writes.FileWrites(None, 1)
    file = writes.start(fd, 4, 0o640, 0.0)
    promised = Future[None]()
    writes.route(file).promise(promised)
    writes.end(file)
    promised.set_exception(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)):
        writes.finish_all()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)  # closed


def test_content_handed_on_is_not_held_while_a_file_written_before_it_is_still_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promised job that waits (a slow disk under one file) lets the extracting thread run
    ahead, as many files as it keeps open; what it was handed meanwhile must be freed, not kept
    until the job is done (with 16 threads and large files, that was gigabytes)."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "a-shard.bin").write_bytes(os.urandom(24 * MIB))
    words = b"step loss lr grad norm epoch batch tokens " * 24
    for number in range(file_writes.OPEN_FILES + 8):  # 256 KiB each, deflated
        (source / f"t-{number:03}.txt").write_bytes(words * (256 * 1024 // len(words)) + b"%d" % number)
    restored = tmp_path / "restored"
    # The file whose finishing waits for the shard's: by then 16 MiB of text were handed on.
    furthest = restored / f"t-{file_writes.OPEN_FILES - 1:03}.txt"
    held: list[int] = []
    claimed = threading.Lock()

    def slow_under_the_shard(pieces: list[memoryview], offset: int) -> None:
        # A promised member of the shard (past those read before its header): one thread
        # waits in it, the other goes on.
        if offset >= 8 * MIB and sum(map(len, pieces)) == MIB and claimed.acquire(blocking=False):
            for _ in range(3000):
                if furthest.exists():
                    break
                threading.Event().wait(0.01)
            held.append(tracemalloc.get_traced_memory()[0])

    watch_routed_writes(monkeypatch, slow_under_the_shard)
    data = ReadableAtOffsets(packed(source))
    tracemalloc.start()
    try:
        archive.unpack_archive(data, restored, threads=2)
    finally:
        tracemalloc.stop()
    assert tree_of(restored) == tree_of(source)
    assert len(held) == 1
    assert held[0] < 8 * MIB  # the members in flight, not the 16 MiB handed on


def test_cutting_views_splits_them_at_the_offsets_without_copying() -> None:
    content = [memoryview(b"abcd"), memoryview(b"efgh"), memoryview(b"ij")]
    before, inside, after = cut(content, 3, 9)
    assert [bytes(v) for v in before] == [b"abc"]
    assert [bytes(v) for v in inside] == [b"d", b"efgh", b"i"]
    assert [bytes(v) for v in after] == [b"j"]
    assert all(isinstance(v, memoryview) for v in before + inside + after)


def test_routed_file_data_cannot_be_read_as_bytes(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "weights.bin").write_bytes(os.urandom(8 * MIB))
    data = ReadableAtOffsets(packed(source))
    head = data.read(members.HEADER_PREFIX)
    with member_reader.IndexedReader(data, head, threads=2) as reader:
        assert len(reader.read(512)) == 512  # the file's tar header
        reader.route(8 * MIB, Discarded())
        with pytest.raises(RuntimeError, match="routed file data"):
            _read_to_the_end(reader)


class Discarded:
    """A route that writes nothing."""

    def write(self, pieces: list[memoryview], offset: int) -> None:
        pass

    def promise(self, job: Future[Any]) -> None:
        pass


def _read_to_the_end(reader: member_reader.IndexedReader) -> None:
    while reader.read(MIB):
        pass
