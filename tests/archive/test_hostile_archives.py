"""Hostile archives must be refused by ``Checkpoint.load_sync()`` without touching anything outside.

Every case writes a crafted tar.gz (or plain tar) as the previous-checkpoint object with a plain
``open()`` (no recorded format, so it is sniffed, exactly like an object written by another
tool), loads it through :class:`Checkpoint`, and checks four things:

* the load raises :class:`UnsafeArchiveError` (or :class:`ArchiveLimitError` for limits, or
  :class:`CheckpointCorruptError` for malformed headers);
* the message names the offending member and the source object;
* the workspace is left empty;
* nothing changed anywhere else below ``tmp_path``: the workspace is created beside a sentinel
  directory (``tempfile.tempdir`` is pointed into ``tmp_path``), so a member that escapes
  would land on a sentinel.

setuid/setgid/sticky bits are the exception: PEP 706's ``data`` filter strips them, so those
archives load, with the bits cleared.

Slow tests: set ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` to also run the archive of millions of tiny
members against the default limit (one to two minutes; it checks that counting members costs
neither memory nor disk).
"""

from __future__ import annotations

import os
import resource
import stat
import tarfile
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from flyte_checkpoint import (
    ArchiveLimitError,
    Checkpoint,
    CheckpointCorruptError,
    ExtractionLimits,
    UnsafeArchiveError,
)
from flyte_checkpoint.archive.limits import MAX_UNRECORDED_MEMBERS_ENV
from tests.archive import hostile
from tests.archive.hostile import Member, Site, directory, file, hardlink, special, symlink

SLOW = os.environ.get("FLYTE_CHECKPOINT_SLOW_TESTS") == "1"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    """A sandbox whose temporary directory (where workspaces go) holds sentinels."""
    made = hostile.make_site(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(made.temp))
    return made


def workspace_length(site: Site) -> int:
    """The length of the workspace path the checkpoint will create: ``temp/flyte-cp-XXXXXXXX``."""
    return len(str(site.temp / "flyte-cp-")) + 8


def refuse(
    site: Site,
    data: bytes,
    *,
    member: str,
    error: type[CheckpointCorruptError] = UnsafeArchiveError,
    limits: ExtractionLimits | None = None,
) -> CheckpointCorruptError:
    """Load ``data`` as the previous checkpoint and check it is refused cleanly; return the error."""
    site.write_source(data)
    before = hostile.snapshot(site.root)
    checkpoint = Checkpoint(site.destination, str(site.source), extraction_limits=limits)
    workspace = checkpoint.path
    try:
        with pytest.raises(error) as raised:
            checkpoint.load_sync()
        assert list(workspace.iterdir()) == [], "the workspace must be left empty"
        after = hostile.snapshot(site.root, skip=workspace)
        assert after == before, "nothing outside the workspace may change"
    finally:
        checkpoint.close()
    message = str(raised.value)
    assert repr(member) in message, f"the message should name {member!r}: {message}"
    assert str(site.source) in message, f"the message should name the source object: {message}"
    return raised.value


# ---------------------------------------------------------------------------------------------
# The catalogue of hostile archives. Each builds its members from the site (some aim at paths in
# it) and names the member the refusal must mention.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    """A hostile archive: its members, the member the refusal must name, the error expected.

    ``member`` may contain ``{outside}``, replaced by the sentinel directory's path.
    """

    members: Callable[[Site], list[Member]]
    member: str
    error: type[CheckpointCorruptError] = UnsafeArchiveError

    def member_for(self, site: Site) -> str:
        return self.member.replace("{outside}", str(site.outside))


def _cve_2025_4517(site: Site) -> list[Member]:
    max_path = os.pathconf(site.temp, "PC_PATH_MAX")
    return hostile.symlink_realpath_overflow((max_path - workspace_length(site) - 1) // 17)


def _cve_2025_4517_targets_only(site: Site) -> list[Member]:
    """The same overflow built only from link *targets*, so no member is written through a link.

    Real directories ``D/D/…`` (16 deep, close to PATH_MAX), a one-letter link at each level to
    the next directory, at the bottom ``up`` pointing back to the workspace root, and ``esc``
    whose target walks the one-letter chain, ``up`` and one more ``..``: lexically inside,
    really outside.
    """
    steps = "abcdefghijklmnop"
    max_path = os.pathconf(site.temp, "PC_PATH_MAX")
    component = "d" * ((max_path - workspace_length(site) - 1) // 18)
    members: list[Member] = []
    path = ""
    for step in steps:
        members.append(directory(os.path.join(path, component)))
        members.append(symlink(os.path.join(path, step), component))
        path = os.path.join(path, component)
    members.append(symlink(os.path.join(path, "up"), os.path.join(*([".."] * len(steps)))))
    members.append(symlink("esc", os.path.join(*steps, "up", "..")))
    return members


HOSTILE: dict[str, Hostile] = {
    # names that leave the tree
    "dotdot_name": Hostile(lambda s: [file("../victim", b"evil")], "../victim"),
    "nested_dotdot_name": Hostile(lambda s: [file("a/../../victim", b"evil")], "a/../../victim"),
    "dotdot_after_dirs": Hostile(
        lambda s: [directory("a"), directory("a/b"), file("a/b/../../../victim", b"evil")],
        "a/b/../../../victim",
    ),
    "absolute_name": Hostile(lambda s: [file(f"{s.outside}/absolute", b"evil")], "{outside}/absolute"),
    "absolute_name_double_slash": Hostile(
        lambda s: [file(f"/{s.outside}/absolute", b"evil")], "/{outside}/absolute"
    ),
    "absolute_directory": Hostile(lambda s: [directory(f"{s.outside}/made")], "{outside}/made/"),
    "gnu_longname_dotdot": Hostile(
        lambda s: [file("../" + "n" * 150, b"evil", fmt=tarfile.GNU_FORMAT)], "../" + "n" * 150
    ),
    "pax_path_dotdot": Hostile(lambda s: [file("innocent", b"evil", pax={"path": "../victim"})], "../victim"),
    "pax_path_absolute": Hostile(
        lambda s: [file("innocent", b"evil", pax={"path": f"{s.outside}/victim"})], "{outside}/victim"
    ),
    "nul_in_pax_path": Hostile(lambda s: [file("innocent", b"evil", pax={"path": "a\x00b"})], "a\x00b"),
    # symbolic links
    "symlink_dotdot_then_write_through": Hostile(
        lambda s: [symlink("link", "../outside"), file("link/victim", b"evil")], "link"
    ),
    "symlink_absolute_then_write_through": Hostile(
        lambda s: [symlink("link", str(s.outside)), file("link/victim", b"evil")], "link"
    ),
    "symlink_absolute_alone": Hostile(lambda s: [symlink("link", str(s.outside))], "link"),
    "symlink_deep_dotdot": Hostile(lambda s: [symlink("a/b/link", "../../../outside")], "a/b/link"),
    "symlink_empty_target": Hostile(lambda s: [symlink("link", "")], "link"),
    "symlink_nul_in_pax_target": Hostile(
        lambda s: [symlink("link", "x", pax={"linkpath": "ok\x00../../victim"})], "link"
    ),
    "symlink_pax_linkpath_dotdot": Hostile(
        lambda s: [symlink("link", "harmless", pax={"linkpath": "../outside"})], "link"
    ),
    "symlink_chain_up_then_out": Hostile(
        lambda s: [symlink("sub/up", ".."), symlink("esc", "sub/up/..")], "esc"
    ),
    "symlink_chain_out_declared_before_its_link": Hostile(
        lambda s: [symlink("esc", "sub/up/.."), symlink("sub/up", "..")], "esc"
    ),
    "symlink_through_self_link_declared_first": Hostile(
        lambda s: [symlink("a", "b/../victim"), symlink("b", ".")], "a"
    ),
    "symlink_dot_chain_a_then_a_b": Hostile(lambda s: [symlink("a", "."), symlink("a/b", "..")], "a"),
    "symlink_dot_chain_a_b_then_a": Hostile(lambda s: [symlink("a/b", ".."), symlink("a", ".")], "a"),
    "symlink_repeated_self_link": Hostile(
        lambda s: [symlink("x", "a/a/a/../.."), symlink("a", ".")],
        "x",
    ),
    "symlink_loop": Hostile(lambda s: [symlink("a", "b"), symlink("b", "a")], "a"),
    "symlink_chain_deeper_than_the_kernel_follows": Hostile(
        lambda s: [symlink("l0", "."), *[symlink(f"l{i}", f"l{i - 1}") for i in range(1, 45)]],
        "l41",
    ),
    "symlink_write_through_chain": Hostile(
        lambda s: [symlink("sub/up", ".."), symlink("esc", "sub/up/.."), file("esc/victim", b"evil")],
        "esc",
    ),
    "cve_2025_4517_realpath_overflow": Hostile(_cve_2025_4517, "flaglink"),
    "cve_2025_4517_targets_only": Hostile(_cve_2025_4517_targets_only, "esc"),
    # hard links
    "hardlink_absolute": Hostile(lambda s: [hardlink("h", "/etc/passwd")], "h"),
    "hardlink_to_sentinel_absolute": Hostile(lambda s: [hardlink("h", str(s.outside / "victim"))], "h"),
    "hardlink_dotdot": Hostile(lambda s: [hardlink("h", "../outside/victim")], "h"),
    "hardlink_then_write": Hostile(
        lambda s: [hardlink("h", "../victim"), file("h", b"evil")],
        "h",
    ),
    "hardlink_to_not_yet_extracted": Hostile(lambda s: [hardlink("h", "later"), file("later")], "h"),
    "hardlink_to_directory": Hostile(lambda s: [directory("d"), hardlink("h", "d")], "h"),
    "hardlink_to_symlink": Hostile(
        lambda s: [file("f"), symlink("s", "f"), hardlink("h", "s")],
        "h",
    ),
    "hardlink_through_symlink": Hostile(
        lambda s: [symlink("s", "."), file("f"), hardlink("h", "s/f")],
        "h",
    ),
    "hardlink_to_itself": Hostile(lambda s: [file("a"), hardlink("a", "a")], "a"),
    # special files
    "character_device": Hostile(lambda s: [special("dev", tarfile.CHRTYPE)], "dev"),
    "block_device": Hostile(lambda s: [special("blk", tarfile.BLKTYPE)], "blk"),
    "fifo": Hostile(lambda s: [special("pipe", tarfile.FIFOTYPE)], "pipe"),
    "unknown_member_type": Hostile(lambda s: [hostile.raw_member("vol", b"V", 0)], "vol"),
    "gnu_sparse_member": Hostile(lambda s: [hostile.raw_member("sparse", b"S", 0)], "sparse"),
    # replacing what is already there
    "directory_replaced_by_symlink": Hostile(
        lambda s: [directory("d"), symlink("d", "../outside"), file("d/victim")], "d"
    ),
    "directory_with_content_replaced_by_symlink": Hostile(
        lambda s: [directory("d"), file("d/f"), symlink("d", ".")], "d"
    ),
    "symlink_replaced_by_directory": Hostile(lambda s: [symlink("d", "."), directory("d")], "d"),
    "file_then_directory_same_name": Hostile(lambda s: [file("f"), directory("f")], "f/"),
    "directory_then_file_same_name": Hostile(lambda s: [directory("d"), file("d")], "d"),
    "file_then_symlink_same_name": Hostile(lambda s: [file("f"), symlink("f", ".")], "f"),
    "file_then_write_below_it": Hostile(lambda s: [file("f"), file("f/g")], "f/g"),
    "file_named_dot": Hostile(lambda s: [file("./", b"evil")], "./"),
    # limits and malformed headers
    "huge_pax_extended_header": Hostile(
        lambda s: [hostile.raw_member("././@PaxHeader", tarfile.XHDTYPE, 1 << 40)],
        "././@PaxHeader",
        ArchiveLimitError,
    ),
    "huge_gnu_longname_header": Hostile(
        lambda s: [hostile.raw_member("././@LongLink", tarfile.GNUTYPE_LONGNAME, 1 << 40)],
        "././@LongLink",
        ArchiveLimitError,
    ),
    "negative_pax_size": Hostile(
        lambda s: [file("neg", b"", pax={"size": "-4096"}), file("next", b"x")],
        "neg",
        CheckpointCorruptError,
    ),
    "pax_mtime_out_of_range": Hostile(
        lambda s: [file("when", b"x", pax={"mtime": "1e300"})], "when", CheckpointCorruptError
    ),
    "name_component_longer_than_the_filesystem_allows": Hostile(
        lambda s: [file("x" * 300, b"x")], "x" * 300, CheckpointCorruptError
    ),
}


@pytest.mark.parametrize("case", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_archive_is_refused_and_nothing_escapes(site: Site, case: Hostile) -> None:
    refuse(site, hostile.tar_gz(case.members(site)), member=case.member_for(site), error=case.error)


@pytest.mark.parametrize(
    "case",
    [HOSTILE["dotdot_name"], HOSTILE["symlink_chain_out_declared_before_its_link"], HOSTILE["fifo"]],
    ids=["dotdot_name", "symlink_chain_out_declared_before_its_link", "fifo"],
)
def test_hostile_plain_tar_without_gzip_is_refused_too(site: Site, case: Hostile) -> None:
    refuse(site, hostile.tar_bytes(case.members(site)), member=case.member_for(site), error=case.error)


def test_a_declared_terabyte_is_refused_by_the_byte_limit_before_any_data_is_read(site: Site) -> None:
    # The header is not followed by data at all: reaching for it would be a truncation error.
    data = hostile.tar_gz([file("small", b"ok"), hostile.declared_only("huge", 1 << 40)])
    refuse(
        site,
        data,
        member="huge",
        error=ArchiveLimitError,
        limits=ExtractionLimits(max_total_bytes=1 << 20),
    )


def test_a_small_gzip_of_zeros_unpacking_to_half_a_gibibyte_is_refused_by_the_default_expansion_bound(
    site: Site,
) -> None:
    data = hostile.file_tar_gz("bomb", 512 << 20)
    assert len(data) < 1 << 20
    error = refuse(site, data, member="bomb", error=ArchiveLimitError)
    assert "max_expansion_ratio" in str(error)
    assert "ExtractionLimits(" in str(error), "the message should say how to raise the bound"


def test_an_archive_of_zeros_below_the_expansion_floor_loads_with_the_default_limits(site: Site) -> None:
    site.write_source(hostile.file_tar_gz("zeros", 32 << 20))
    with Checkpoint(site.destination, str(site.source)) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert (restored / "zeros").stat().st_size == 32 << 20


def test_a_highly_compressible_genuine_file_within_the_expansion_bound_loads(site: Site) -> None:
    # Sparse "weights": one random byte in 32, which gzip shrinks about 20x, under a floor of 1 MiB.
    pattern = b"".join(bytes([byte]) + bytes(31) for byte in os.urandom(4096))
    data = hostile.file_tar_gz("weights", 16 << 20, pattern)
    assert 10 < (16 << 20) / len(data) < 100
    limits = ExtractionLimits(expansion_checked_after_bytes=1 << 20)
    with Checkpoint(site.destination, str(site.source), extraction_limits=limits) as checkpoint:
        site.write_source(data)
        restored = checkpoint.load_sync()
        assert restored is not None
        assert (restored / "weights").stat().st_size == 16 << 20


def test_the_expansion_bound_can_be_lifted_for_a_genuine_checkpoint(site: Site) -> None:
    site.write_source(hostile.file_tar_gz("zeros", 8 << 20))
    limits = ExtractionLimits(expansion_checked_after_bytes=1 << 20, max_expansion_ratio=None)
    with Checkpoint(site.destination, str(site.source), extraction_limits=limits) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert (restored / "zeros").stat().st_size == 8 << 20


def test_the_byte_limit_counts_every_member_not_just_the_largest(site: Site) -> None:
    data = hostile.tar_gz([file(f"f{i}", bytes(100_000)) for i in range(20)])
    refuse(
        site,
        data,
        member="f10",
        error=ArchiveLimitError,
        limits=ExtractionLimits(max_total_bytes=1_000_000),
    )


def test_more_members_than_the_limit_are_refused_naming_the_first_one_over(site: Site) -> None:
    data = hostile.tar_gz([file(f"m{i:04d}", b"") for i in range(1000)])
    refuse(site, data, member="m0500", error=ArchiveLimitError, limits=ExtractionLimits(max_members=500))


def test_a_terabyte_extended_header_is_refused_without_buffering_it(site: Site) -> None:
    # 256 MiB of zeros follow the header; a reader that buffers the declared size holds them all.
    header = hostile.gzipped(hostile.raw_member("././@PaxHeader", tarfile.XHDTYPE, 1 << 40).to_bytes())
    data = header + hostile.zeros_gzip_member(16 << 20) * 16
    tracemalloc.start()
    try:
        error = refuse(site, data, member="././@PaxHeader", error=ArchiveLimitError)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak traced memory {peak >> 20} MiB while refusing: {error}"


@pytest.mark.timeout(10)
def test_a_pax_header_built_to_backtrack_regular_expressions_is_refused_quickly(site: Site) -> None:
    # CVE-2024-6232: tarfile before 3.11.10/3.12.6 spends quadratic time on this 192 KiB record.
    records = b"1" * (192 * 1024)
    data = hostile.tar_gz(
        [hostile.raw_member("././@PaxHeader", tarfile.XHDTYPE, len(records), records), file("f")]
    )
    started = time.monotonic()
    refuse(site, data, member="././@PaxHeader", error=CheckpointCorruptError)
    assert time.monotonic() - started < 2


@pytest.mark.timeout(300)
def test_a_foreign_archive_of_many_empty_files_is_refused_by_the_default_unrecorded_member_limit(
    site: Site,
) -> None:
    # A scaled-down million: past the 10,000 members an archive without our record may hold,
    # far below the 1,000,000 of max_members, which refused it only after minutes of creating files.
    with open(site.source, "wb") as sink:
        hostile.write_many_members_tar_gz(sink, 12_000, distinct=True)
    error = refuse(site, site.source.read_bytes(), member="0010000", error=ArchiveLimitError)
    assert "max_unrecorded_members=10000" in str(error)
    assert MAX_UNRECORDED_MEMBERS_ENV in str(error)


def test_an_archive_we_saved_may_hold_more_members_than_a_foreign_one(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MAX_UNRECORDED_MEMBERS_ENV, "50")
    tree = site.root / "tree"
    tree.mkdir()
    for number in range(60):
        (tree / f"f{number:02d}").write_bytes(b"x")
    Checkpoint(str(site.source)).save_sync(tree)
    checkpoint, restored = load_tree(site)
    with checkpoint:
        assert sorted(path.name for path in restored.iterdir()) == sorted(
            path.name for path in tree.iterdir()
        )
    # The same bytes without our record (copied by a tool that drops it) are a foreign archive.
    refuse(site, site.source.read_bytes(), member="f50", error=ArchiveLimitError)


@pytest.mark.skipif(not SLOW, reason="set FLYTE_CHECKPOINT_SLOW_TESTS=1 to run")
@pytest.mark.timeout(900)
def test_millions_of_tiny_members_hit_the_default_member_limit_in_flat_memory(site: Site) -> None:
    count = 1_200_000
    with open(site.source, "wb") as sink:
        hostile.write_many_members_tar_gz(sink, count)
    # Only max_members: the bound for foreign archives would refuse them 990,000 members earlier.
    limits = ExtractionLimits(max_unrecorded_members=None)
    checkpoint = Checkpoint(site.destination, str(site.source), extraction_limits=limits)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        with pytest.raises(ArchiveLimitError) as raised:
            checkpoint.load_sync()
        assert list(checkpoint.path.iterdir()) == []
    finally:
        checkpoint.close()
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert "1000000" in str(raised.value)
    assert grown_kib < 200 * 1024, f"peak RSS grew by {grown_kib >> 10} MiB"


# ---------------------------------------------------------------------------------------------
# What the data filter strips instead of refusing, and names that are only odd on POSIX
# ---------------------------------------------------------------------------------------------


def load_tree(site: Site, members: list[Member] | None = None) -> tuple[Checkpoint, Path]:
    """Load ``members`` as a tar.gz (or the source already written) and return the restored root."""
    if members is not None:
        site.write_source(hostile.tar_gz(members))
    checkpoint = Checkpoint(site.destination, str(site.source))
    restored = checkpoint.load_sync()
    assert restored is not None
    return checkpoint, restored


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(0o4755, 0o755), (0o2755, 0o755), (0o6777, 0o755), (0o4644, 0o644), (0o666, 0o644), (0o1600, 0o600)],
    ids=["setuid", "setgid", "setuid_setgid_all_write", "setuid_no_exec", "world_writable", "sticky"],
)
def test_special_mode_bits_on_files_are_stripped_not_refused(site: Site, mode: int, expected: int) -> None:
    checkpoint, restored = load_tree(site, [file("tool", b"#!/bin/sh\n", mode=mode)])
    with checkpoint:
        assert mode_of(restored / "tool") == expected


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(0o1777, 0o755), (0o2775, 0o755), (0o3700, 0o700), (0o500, 0o700)],
    ids=["sticky_world_writable", "setgid_group_writable", "sticky_setgid_private", "read_only"],
)
def test_special_mode_bits_on_directories_are_stripped_not_refused(
    site: Site, mode: int, expected: int
) -> None:
    checkpoint, restored = load_tree(site, [directory("shared", mode=mode), file("shared/f")])
    with checkpoint:
        assert mode_of(restored / "shared") == expected
        assert (restored / "shared" / "f").read_bytes() == b"payload"


@pytest.mark.parametrize("name", ["C:x", "C:\\Windows\\x", "..\\..\\victim", "a:b/c"])
def test_windows_looking_names_are_plain_names_inside_the_workspace_on_posix(site: Site, name: str) -> None:
    site.write_source(hostile.tar_gz([file(name, b"content")]))
    before = hostile.snapshot(site.root)
    checkpoint, restored = load_tree(site)
    with checkpoint:
        assert (restored / name).read_bytes() == b"content"
        assert hostile.snapshot(site.root, skip=restored) == before


def test_a_symlink_that_stays_inside_through_a_chain_is_kept(site: Site) -> None:
    checkpoint, restored = load_tree(
        site,
        [file("data/f", b"inside"), symlink("sub/up", ".."), symlink("via", "sub/up/data/f")],
    )
    with checkpoint:
        assert os.readlink(restored / "via") == "sub/up/data/f"
        assert (restored / "via").read_bytes() == b"inside"


def test_a_dangling_symlink_inside_the_tree_is_kept(site: Site) -> None:
    checkpoint, restored = load_tree(site, [symlink("later", "not/yet/made")])
    with checkpoint:
        assert os.readlink(restored / "later") == "not/yet/made"
