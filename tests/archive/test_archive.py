"""The directory archive: streaming tar.gz pack and safe unpack of genuine trees."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import socket
import stat
import subprocess
import tarfile
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flyte_checkpoint import Checkpoint, ConfigurationError, InvalidCheckpointInputError, archive
from flyte_checkpoint.archive import (
    ExtractionLimits,
    pack_directory,
    sniff_kind,
    unpack_archive,
)
from flyte_checkpoint.archive.compression import gzip_writer
from flyte_checkpoint.archive.tar_writer import TarWriter
from flyte_checkpoint.errors import (
    ArchiveLimitError,
    CheckpointCorruptError,
    InputChangedError,
    UnsafeArchiveError,
)

MTIME = 1_600_000_000.25


def packed(source: Path, *, level: int = archive.DEFAULT_COMPRESSION_LEVEL) -> bytes:
    sink = io.BytesIO()
    pack_directory(source, sink, level=level)
    return sink.getvalue()


def unpacked(data: bytes, dest: Path, *, compressed: bool = True) -> Path:
    unpack_archive(io.BytesIO(data), dest, compressed=compressed)
    return dest


def layout(root: Path) -> dict[str, tuple[str, bytes | str | None, int]]:
    """Relative path -> (kind, content or link target, permission bits); links are not followed."""
    entries: dict[str, tuple[str, bytes | str | None, int]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(directory) / name
            status = os.lstat(path)
            key = path.relative_to(root).as_posix()
            if stat.S_ISLNK(status.st_mode):
                entries[key] = ("link", os.readlink(path), 0)
            elif stat.S_ISDIR(status.st_mode):
                entries[key] = ("dir", None, stat.S_IMODE(status.st_mode))
            else:
                entries[key] = ("file", path.read_bytes(), stat.S_IMODE(status.st_mode))
    return entries


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Nested directories, empty ones, empty files, unicode and spaces, modes, links."""
    root = tmp_path / "source tree"
    (root / "a" / "b" / "c").mkdir(parents=True)
    (root / "empty dir").mkdir()
    (root / "ünïcödé ✓" / "with space").mkdir(parents=True)
    (root / "a" / "b" / "c" / "deep.bin").write_bytes(os.urandom(200_000))
    (root / "a" / "text.txt").write_text("hello\n" * 1000)
    (root / "empty file").write_bytes(b"")
    (root / "ünïcödé ✓" / "with space" / "ß ø 日本.txt").write_text("unicode content ✓")
    (root / "script.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "script.sh").chmod(0o755)
    (root / "private").write_bytes(b"secret")
    (root / "private").chmod(0o600)
    (root / "a" / "b").chmod(0o700)
    os.symlink("a/text.txt", root / "link to text")
    os.symlink("../../empty dir", root / "a" / "b" / "link to dir")
    os.link(root / "a" / "text.txt", root / "hardlinked text")
    for path in [root / "a" / "text.txt", root / "private", root / "script.sh"]:
        os.utime(path, (MTIME, MTIME))
    return root


# ---------------------------------------------------------------------------------------------
# Round trip
# ---------------------------------------------------------------------------------------------


def test_a_nested_tree_round_trips_with_contents_layout_and_modes(tree: Path, tmp_path: Path) -> None:
    restored = unpacked(packed(tree), tmp_path / "restored")
    assert layout(restored) == layout(tree)


def test_file_modification_times_round_trip(tree: Path, tmp_path: Path) -> None:
    restored = unpacked(packed(tree), tmp_path / "restored")
    for name in ["a/text.txt", "private", "script.sh"]:
        assert os.stat(restored / name).st_mtime == pytest.approx(MTIME, abs=1e-6), name


def test_in_tree_symlinks_are_kept_as_links(tree: Path, tmp_path: Path) -> None:
    restored = unpacked(packed(tree), tmp_path / "restored")
    assert os.readlink(restored / "link to text") == "a/text.txt"
    assert (restored / "link to text").read_text() == "hello\n" * 1000
    assert (restored / "a" / "b" / "link to dir").resolve() == (restored / "empty dir").resolve()


def test_an_absolute_link_inside_the_tree_is_stored_relative(tree: Path, tmp_path: Path) -> None:
    os.symlink(tree / "a" / "text.txt", tree / "absolute link")
    restored = unpacked(packed(tree), tmp_path / "restored")
    assert os.readlink(restored / "absolute link") == "a/text.txt"


def test_hardlinks_are_kept_as_one_file(tree: Path, tmp_path: Path) -> None:
    restored = unpacked(packed(tree), tmp_path / "restored")
    assert os.stat(restored / "hardlinked text").st_ino == os.stat(restored / "a" / "text.txt").st_ino


def test_long_names_and_link_targets_round_trip(tmp_path: Path) -> None:
    source = tmp_path / "src"
    deep = source / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    (deep / ("f" * 200)).write_bytes(b"long")
    os.symlink(f"{'d' * 120}/{'e' * 120}/{'f' * 200}", source / "link")
    restored = unpacked(packed(source), tmp_path / "restored")
    assert layout(restored) == layout(source)
    assert (restored / "link").read_bytes() == b"long"


def test_a_file_name_that_is_not_utf8_round_trips(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    with open(os.path.join(os.fsencode(source), b"latin1-\xe9t\xe9"), "wb") as out:
        out.write(b"bytes name")
    restored = unpacked(packed(source), tmp_path / "restored")
    assert os.listdir(os.fsencode(restored)) == [b"latin1-\xe9t\xe9"]


def test_an_empty_directory_round_trips_to_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    restored = unpacked(packed(tmp_path / "empty"), tmp_path / "restored")
    assert list(restored.iterdir()) == []


def test_the_archive_is_readable_by_the_tar_command(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "object.tar.gz").write_bytes(packed(tree))
    (tmp_path / "by-tar").mkdir()
    command = ["tar", "-xzf", str(tmp_path / "object.tar.gz"), "-C", str(tmp_path / "by-tar")]
    subprocess.run(command, check=True)
    assert layout(tmp_path / "by-tar") == layout(tree)


@pytest.mark.parametrize("tar_format", ["gnu", "posix", "ustar"])
def test_an_archive_written_by_the_tar_command_unpacks(tree: Path, tmp_path: Path, tar_format: str) -> None:
    target = tmp_path / "by-tar.tar.gz"
    command = ["tar", f"--format={tar_format}", "-czf", str(target), "-C", str(tree), "."]
    subprocess.run(command, check=True)
    assert layout(unpacked(target.read_bytes(), tmp_path / "restored")) == layout(tree)


def peak_memory_packing(source: Path) -> int:
    tracemalloc.start()
    try:
        with open(os.devnull, "wb") as sink:
            pack_directory(source, sink)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def small_files_tree(root: Path, directories: int) -> Path:
    for d in range(directories):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(1000):
            (root / f"d{d}" / f"f{f}").write_bytes(b"tiny")
    return root


def test_packing_many_small_files_keeps_no_memory_per_file(tmp_path: Path) -> None:
    few = peak_memory_packing(small_files_tree(tmp_path / "few", 4))
    many = peak_memory_packing(small_files_tree(tmp_path / "many", 16))
    # tarfile kept a TarInfo and an inode entry per file: about 1 KiB each, 13 MiB more here.
    assert many - few < 3 << 20, f"12,000 more files took {(many - few) / (1 << 20):.1f} MiB more"


def listed_at(path: Path, size: int) -> os.stat_result:
    """``path``'s status as if it had been ``size`` bytes when the tree was listed."""
    status = os.lstat(path)
    extra = {key: getattr(status, key) for key in ("st_mtime", "st_mtime_ns", "st_atime_ns", "st_ctime_ns")}
    return os.stat_result((*status[:6], size, *status[7:]), extra)


def pack_one_file(path: Path, status: os.stat_result) -> None:
    with gzip_writer(io.BytesIO(), 1, threads=2) as out:
        writer = TarWriter(out)
        writer.add_file("f", str(path), status)
        writer.close()


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_file_that_shrinks_while_it_is_packed_is_an_input_change(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"short")
    with pytest.raises(InputChangedError, match="shrank from 1000 to 5 bytes"):
        pack_one_file(tmp_path / "f", listed_at(tmp_path / "f", 1000))


def test_a_large_file_that_shrinks_while_the_encoding_threads_read_it_is_an_input_change(
    tmp_path: Path,
) -> None:
    (tmp_path / "f").write_bytes(os.urandom(3 << 20))
    with pytest.raises(InputChangedError, match=f"shrank from {5 << 20} to {3 << 20} bytes"):
        pack_one_file(tmp_path / "f", listed_at(tmp_path / "f", 5 << 20))


def test_a_large_file_that_grows_while_it_is_packed_is_stored_at_its_listed_size(tmp_path: Path) -> None:
    content = os.urandom(3 << 20)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f").write_bytes(content)
    sink = io.BytesIO()
    with gzip_writer(sink, 1, threads=2) as out:
        writer = TarWriter(out)
        writer.add_file("f", str(tmp_path / "tree" / "f"), listed_at(tmp_path / "tree" / "f", 2 << 20))
        writer.close()
    restored = unpacked(sink.getvalue(), tmp_path / "restored")
    assert (restored / "f").read_bytes() == content[: 2 << 20]


class DescriptorCountingSink(io.BytesIO):
    """Records the most descriptors this process had open whenever a member was written."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def write(self, data: bytes | bytearray | memoryview, /) -> int:  # type: ignore[override]
        self.most = max(self.most, len(open_descriptors()))
        return super().write(data)


def test_a_save_on_many_threads_keeps_a_bounded_number_of_files_open(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for number in range(150):
        (tree / f"w{number:03}").write_bytes(bytes([number]) * ((1 << 20) + 1))
    before = len(open_descriptors())
    sink = DescriptorCountingSink()
    archive.pack_directory(tree, sink, threads=400)
    assert sink.most - before <= 72  # at most 64 files, and a few descriptors of the machinery
    assert layout(unpacked(sink.getvalue(), tmp_path / "restored")) == layout(tree)


def test_packing_closes_every_file_it_opened_when_it_finishes_and_when_it_fails(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for number in range(6):
        (tree / f"w{number}").write_bytes(os.urandom((1 << 20) + 4096 * number))
    before = open_descriptors()
    packed(tree)
    with pytest.raises(InputChangedError):
        pack_one_file(tree / "w5", listed_at(tree / "w5", 9 << 20))
    assert open_descriptors() == before


# ---------------------------------------------------------------------------------------------
# Fidelity against tar -xp: what is kept, what is normalised, what is refused
# ---------------------------------------------------------------------------------------------


def test_directory_modification_times_are_restored_after_their_contents(tree: Path, tmp_path: Path) -> None:
    for directory in [tree / "a", tree / "a" / "b", tree / "empty dir"]:
        os.utime(directory, (MTIME, MTIME))
    restored = unpacked(packed(tree), tmp_path / "restored")
    for name in ["a", "a/b", "empty dir"]:
        assert os.stat(restored / name).st_mtime == pytest.approx(MTIME, abs=1e-6), name


def test_directory_modification_times_from_the_tar_command_are_restored(tree: Path, tmp_path: Path) -> None:
    os.utime(tree / "a", (MTIME, MTIME))
    target = tmp_path / "by-tar.tar.gz"
    subprocess.run(["tar", "-czf", str(target), "-C", str(tree), "."], check=True)
    restored = unpacked(target.read_bytes(), tmp_path / "restored")
    assert os.stat(restored / "a").st_mtime == int(MTIME)


def test_read_only_modes_come_back_owner_writable_as_documented(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "locked").mkdir(parents=True)
    (source / "locked" / "frozen.txt").write_text("x")
    (source / "locked" / "frozen.txt").chmod(0o444)
    (source / "locked").chmod(0o555)
    try:
        restored = unpacked(packed(source), tmp_path / "restored")
    finally:
        (source / "locked").chmod(0o755)
    assert stat.S_IMODE(os.stat(restored / "locked" / "frozen.txt").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(restored / "locked").st_mode) == 0o755


def test_a_sparse_file_comes_back_with_its_holes(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    with open(source / "holes.bin", "wb") as out:
        out.write(b"start")
        out.truncate(64 << 20)
        out.seek(0, os.SEEK_END)
        out.write(b"end")
    restored = unpacked(packed(source), tmp_path / "restored")
    assert (restored / "holes.bin").read_bytes() == (source / "holes.bin").read_bytes()
    assert os.stat(restored / "holes.bin").st_blocks * 512 < 8 << 20


def test_a_file_ending_in_zeros_keeps_its_size(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "tail.bin").write_bytes(b"x" * (1 << 20) + bytes(2 << 20))  # ends on a whole hole
    restored = unpacked(packed(source), tmp_path / "restored")
    assert (restored / "tail.bin").read_bytes() == b"x" * (1 << 20) + bytes(2 << 20)


@pytest.mark.parametrize("tar_format", ["gnu", "posix"])
def test_a_sparse_archive_from_tar_dash_s_is_refused_as_unsupported_naming_the_member(
    tmp_path: Path, tar_format: str
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    with open(source / "holes.bin", "wb") as out:
        out.truncate(8 << 20)
        out.seek(0, os.SEEK_END)
        out.write(b"end")
    target = tmp_path / "sparse.tar.gz"
    command = ["tar", "-S", f"--format={tar_format}", "-czf", str(target), "-C", str(source), "."]
    subprocess.run(command, check=True)
    with pytest.raises(UnsafeArchiveError, match=r"unsupported: sparse member .*holes\.bin"):
        unpacked(target.read_bytes(), tmp_path / "restored")


def test_a_member_path_over_path_max_is_refused_naming_the_limit(tmp_path: Path) -> None:
    name = "/".join(["d" * 250] * 20) + "/deep.txt"  # over 5000 bytes
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    with pytest.raises(ArchiveLimitError, match=r"PATH_MAX"):
        unpacked(sink.getvalue(), tmp_path / "restored")


def test_a_member_name_over_name_max_is_refused_naming_the_limit(tmp_path: Path) -> None:
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("n" * 300)
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ArchiveLimitError, match=r"NAME_MAX"):
        unpacked(sink.getvalue(), tmp_path / "restored")


def test_an_archive_written_by_pythons_tarfile_defaults_unpacks(tree: Path, tmp_path: Path) -> None:
    # What the reference SDK writes: tarfile's default format, one add() per child.
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode="w:gz") as tar:
        for child in sorted(tree.iterdir()):
            tar.add(str(child), arcname=child.name)
    assert layout(unpacked(sink.getvalue(), tmp_path / "restored")) == layout(tree)


def test_the_archive_is_readable_by_pythons_tarfile(tree: Path) -> None:
    contents: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(packed(tree)), mode="r:gz") as tar:
        for member in tar:
            if member.isreg():
                extracted = tar.extractfile(member)
                assert extracted is not None
                contents[member.name] = extracted.read()
    assert contents["a/b/c/deep.bin"] == (tree / "a" / "b" / "c" / "deep.bin").read_bytes()
    assert contents["ünïcödé ✓/with space/ß ø 日本.txt"] == "unicode content ✓".encode()
    assert contents["empty file"] == b""


def test_level_zero_stores_a_valid_uncompressed_gzip(tree: Path, tmp_path: Path) -> None:
    data = packed(tree, level=0)
    plain = gzip.decompress(data)
    assert len(data) > len(plain)  # stored blocks: no compression at all
    assert layout(unpacked(data, tmp_path / "restored")) == layout(tree)


def test_higher_levels_compress_text_smaller_than_level_zero(tree: Path) -> None:
    assert len(packed(tree, level=9)) < len(packed(tree, level=0))


def test_an_out_of_range_level_is_refused(tree: Path) -> None:
    with pytest.raises(ValueError, match="compression level"):
        packed(tree, level=10)


@pytest.mark.skipif(
    not archive.HAVE_ISAL, reason="without python-isal every other test already runs the zlib fallback"
)
def test_the_zlib_fallback_writes_and_reads_the_same_tree(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_isal = packed(tree)
    monkeypatch.setattr(archive.members, "_isal_zlib", None)
    monkeypatch.setattr(archive.compression, "_isal_gzip", None)
    with_zlib = packed(tree)
    assert with_zlib != with_isal  # a different encoder really ran
    assert layout(unpacked(with_zlib, tmp_path / "zlib")) == layout(tree)
    assert layout(unpacked(with_isal, tmp_path / "isal read by zlib")) == layout(tree)


def test_an_uncompressed_tar_stream_unpacks_too(tree: Path, tmp_path: Path) -> None:
    plain = gzip.decompress(packed(tree))
    assert layout(unpacked(plain, tmp_path / "restored", compressed=False)) == layout(tree)


def test_a_tar_stream_that_stops_between_members_is_truncated(tree: Path, tmp_path: Path) -> None:
    plain = gzip.decompress(packed(tree))
    cut = plain.rstrip(b"\x00")
    cut = cut[: len(cut) + (-len(cut) % tarfile.BLOCKSIZE)]  # the last member ends; no end marker
    with pytest.raises(CheckpointCorruptError, match="truncated"):
        unpacked(cut, tmp_path / "restored", compressed=False)


def test_a_misspelt_extraction_limit_is_refused_naming_the_closest_one() -> None:
    with pytest.raises(
        ConfigurationError, match=r"'max_member' is not accepted .*did you mean 'max_members'"
    ):
        ExtractionLimits(max_member=5)  # type: ignore[call-arg]


def test_an_invalid_extraction_limit_names_itself_and_its_value() -> None:
    with pytest.raises(ConfigurationError, match=r"extraction limit 'max_total_bytes'=0"):
        ExtractionLimits(max_total_bytes=0)


def test_a_genuine_archive_within_the_limits_unpacks(tree: Path, tmp_path: Path) -> None:
    limits = ExtractionLimits(max_members=20, max_total_bytes=300_000)
    unpack_archive(io.BytesIO(packed(tree)), tmp_path / "restored", limits=limits)
    assert (tmp_path / "restored" / "a" / "b" / "c" / "deep.bin").stat().st_size == 200_000


# ---------------------------------------------------------------------------------------------
# Sniffing
# ---------------------------------------------------------------------------------------------


def test_sniff_recognises_a_tar_gz(tree: Path) -> None:
    assert sniff_kind(packed(tree)[: archive.SNIFF_BYTES]) == ("archive", True)


def test_sniff_recognises_a_plain_tar(tree: Path) -> None:
    assert sniff_kind(gzip.decompress(packed(tree))[: archive.SNIFF_BYTES]) == ("archive", False)


def test_sniff_takes_a_gzip_of_something_else_for_a_payload() -> None:
    assert sniff_kind(gzip.compress(b"not a tar archive " * 100)) == ("payload", False)


def test_sniff_takes_random_bytes_for_a_payload() -> None:
    assert sniff_kind(os.urandom(4096)) == ("payload", False)


def test_sniff_takes_short_bytes_for_a_payload() -> None:
    assert sniff_kind(b"\x1f") == ("payload", False)


def test_sniff_recognises_the_archive_of_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert sniff_kind(packed(tmp_path / "empty")) == ("archive", True)


def test_sniff_reports_a_gzip_that_cannot_be_inflated_as_an_archive_to_be_checked(tree: Path) -> None:
    damaged = bytearray(packed(tree)[:4096])
    damaged[3] = 0xFF  # reserved gzip flag bits
    assert sniff_kind(bytes(damaged)) == ("archive", True)


def test_sniff_reports_a_gzip_cut_short_as_an_archive_to_be_checked(tree: Path) -> None:
    assert sniff_kind(packed(tree)[:40]) == ("archive", True)


# ---------------------------------------------------------------------------------------------
# Refusals at save time
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (``tmp_path`` may be too long for a Unix socket name)."""
    path = Path("/tmp") / f"fc-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    shutil.rmtree(path)


def refused_save(tmp_path: Path, source: Path) -> str:
    destination = tmp_path / "object"
    with pytest.raises(InvalidCheckpointInputError) as raised:
        Checkpoint(str(destination)).save_sync(source)
    assert not destination.exists(), "nothing may be written for a refused save"
    return str(raised.value)


def test_saving_a_directory_with_a_socket_is_refused_naming_it(tmp_path: Path, short_dir: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(short_dir / "sock"))
        message = refused_save(tmp_path, short_dir)
    finally:
        server.close()
    assert str(short_dir / "sock") in message
    assert "socket" in message


def test_saving_a_directory_with_a_fifo_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "pipe")
    message = refused_save(tmp_path, tmp_path / "src")
    assert str(tmp_path / "src" / "pipe") in message
    assert "FIFO" in message


@pytest.mark.parametrize(
    "target",
    ["../outside", "/etc/passwd", "sub/../../outside", "sub/../../src/file"],
    ids=["dotdot", "absolute", "climbs_out_lexically", "climbs_out_and_back_in"],
)
def test_saving_a_directory_with_a_symlink_leaving_it_is_refused(tmp_path: Path, target: str) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "file").write_bytes(b"x")
    os.symlink(target, source / "link")
    message = refused_save(tmp_path, source)
    assert str(source / "link") in message
    assert repr(target) in message
    assert "outside" in message


def test_saving_a_directory_with_a_symlink_through_a_link_out_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    os.symlink("..", source / "sub" / "up")
    os.symlink("sub/up/..", source / "escape")
    message = refused_save(tmp_path, source)
    assert str(source / "escape") in message


def test_saving_a_directory_with_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    os.symlink("b", source / "a")
    os.symlink("a", source / "b")
    message = refused_save(tmp_path, source)
    assert "loop" in message


def test_a_tree_refused_mid_save_leaves_the_previous_checkpoint_in_place(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"x")
    Checkpoint(str(tmp_path / "ckpt")).save_sync(tmp_path / "src")
    previous = (tmp_path / "ckpt").read_bytes()
    os.mkfifo(tmp_path / "src" / "z-pipe")  # listed after "a": refused once "a" is in the stream
    with pytest.raises(InvalidCheckpointInputError, match="z-pipe"):
        Checkpoint(str(tmp_path / "ckpt")).save_sync(tmp_path / "src")
    assert (tmp_path / "ckpt").read_bytes() == previous


def test_a_walk_of_the_tree_refuses_it_without_writing_anything(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "pipe")
    with pytest.raises(InvalidCheckpointInputError, match="pipe"):
        list(archive.walk_tree(tmp_path / "src"))


# ---------------------------------------------------------------------------------------------
# Property: random trees round-trip
# ---------------------------------------------------------------------------------------------

NAMES = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="/\x00"),
    min_size=1,
    max_size=12,
).filter(lambda name: name not in (".", ".."))
File = tuple[bytes, int]
Tree = dict[str, "File | Tree"]
FILES: st.SearchStrategy[File] = st.tuples(
    st.binary(max_size=4096), st.sampled_from([0o600, 0o644, 0o700, 0o755])
)
TREES: st.SearchStrategy[Tree] = st.recursive(
    st.dictionaries(NAMES, FILES, max_size=4),
    lambda children: st.dictionaries(NAMES, st.one_of(FILES, children), max_size=4),
    max_leaves=12,
)


def materialise(root: Path, spec: Tree) -> None:
    root.mkdir()
    for name, node in spec.items():
        if isinstance(node, dict):
            materialise(root / name, node)
        else:
            content, mode = node
            (root / name).write_bytes(content)
            (root / name).chmod(mode)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=TREES)
def test_random_trees_round_trip_contents_layout_and_file_modes(tmp_path: Path, spec: Tree) -> None:
    work = tmp_path / uuid.uuid4().hex
    work.mkdir()
    try:
        materialise(work / "source", spec)
        restored = unpacked(packed(work / "source"), work / "restored")
        assert layout(restored) == layout(work / "source")
    finally:
        shutil.rmtree(work)
