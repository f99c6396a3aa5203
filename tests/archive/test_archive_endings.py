"""What may follow an archive's end: zero padding loads, anything else is refused the same way.

Two ``.tar.gz`` files concatenated (``cat a.tar.gz b.tar.gz``) are one valid gzip stream that
unpacks to two tar streams; bytes after the gzip stream are not gzip at all. Neither is an
archive this package (or ``tar``) writes, and restoring only the first archive of two would be
silent data loss, so both are refused by load and by verify alike, saying what was found.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from flyte_checkpoint import ArchiveLimitError, Checkpoint, CheckpointCorruptError
from flyte_checkpoint.archive.limits import MAX_EXPANSION_RATIO_ENV
from flyte_checkpoint.single.inspection import inspect_object
from tests.archive import hostile
from tests.archive.hostile import BLOCK, Site, file


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    made = hostile.make_site(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(made.temp))
    return made


def refused_by_load_and_verify(site: Site, data: bytes, match: str) -> None:
    site.write_source(data)
    with Checkpoint(site.destination, str(site.source)) as checkpoint:
        with pytest.raises(CheckpointCorruptError, match=match):
            checkpoint.load_sync()
        assert list(checkpoint.path.iterdir()) == [], "nothing of the first archive may be left"
    with pytest.raises(CheckpointCorruptError, match=match):
        inspect_object(str(site.source), verify=True)


FIRST = [file("first.txt", b"one")]
SECOND = [file("second.txt", b"two")]


def test_two_concatenated_tar_gz_archives_are_refused_naming_the_second_one(site: Site) -> None:
    data = hostile.tar_gz(FIRST) + hostile.tar_gz(SECOND)
    refused_by_load_and_verify(site, data, r"a second archive starts at byte \d+ .*'second.txt'")


def test_two_concatenated_plain_tar_archives_are_refused_naming_the_second_one(site: Site) -> None:
    data = hostile.tar_bytes(FIRST) + hostile.tar_bytes(SECOND)
    refused_by_load_and_verify(site, data, r"a second archive starts at byte \d+ .*'second.txt'")


def test_data_after_the_end_of_archive_marker_inside_the_gzip_stream_is_refused(site: Site) -> None:
    data = hostile.tar_gz(FIRST, end=hostile.END_OF_ARCHIVE + b"not an archive")
    refused_by_load_and_verify(site, data, r"data that is not part of it starts at byte \d+")


def test_bytes_after_the_gzip_stream_are_refused(site: Site) -> None:
    refused_by_load_and_verify(site, hostile.tar_gz(FIRST) + b"trailing garbage", "damaged archive")


def test_an_archive_padded_with_zeros_after_its_end_loads(site: Site) -> None:
    # tar pads its last record with zeros: 10 KiB by default, more with a larger blocking factor.
    site.write_source(hostile.tar_gz(FIRST, end=bytes(40 * 20 * BLOCK)))
    with Checkpoint(site.destination, str(site.source)) as checkpoint:
        restored = checkpoint.load_sync()
        assert restored is not None
        assert (restored / "first.txt").read_bytes() == b"one"


def test_gigabytes_of_zeros_after_the_end_are_refused_by_the_expansion_bound(site: Site) -> None:
    # 300 KiB of gzip that inflates to 300 MiB of "padding": past the 256 MiB after which the
    # expansion bound applies to an archive without our record, as it does to content.
    data = hostile.tar_gz(FIRST) + hostile.zeros_gzip_member(300 << 20)
    site.write_source(data)
    with Checkpoint(site.destination, str(site.source)) as checkpoint:
        with pytest.raises(ArchiveLimitError, match="in the zeros after its end-of-archive marker"):
            checkpoint.load_sync()
        assert list(checkpoint.path.iterdir()) == []
    with pytest.raises(ArchiveLimitError, match=MAX_EXPANSION_RATIO_ENV):
        inspect_object(str(site.source), verify=True)
