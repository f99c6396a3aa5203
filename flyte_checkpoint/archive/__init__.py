"""The directory archive format: a streaming ``.tar.gz`` writer and a safe streaming reader.

This package knows byte streams only, never storage. A directory is tarred and compressed straight
into a writable stream (:mod:`.pack`), and an archive is unpacked straight from a readable stream
(:mod:`.extract`): there is no temporary archive and nothing is held whole in memory.

Extraction does not trust the archive. It follows the ``data`` filter rules of PEP 706 with its
own code, so that it behaves the same on every supported Python (the standard library's filter
had escapes fixed only in late patch releases): no absolute names, no ``..``, no device or FIFO
nodes, no setuid/setgid/sticky bits, hard links only to files already extracted, and symbolic
links created only after every file has been written, then checked, all together, to resolve
inside the tree (:mod:`.links`, the same check that saving applies).

The tar stream is parsed by this package too (:mod:`.tar_headers`: ustar, PAX and GNU long-name
headers), not by :mod:`tarfile`, whose reader differs between Python versions in ways a hostile
archive can use: before 3.11.10/3.12.6 its PAX parser takes quadratic time on crafted records
(CVE-2024-6232), before 3.13 it keeps every member header of a stream in memory, it buffers an
extended header of whatever size the header declares, and it takes a damaged or missing header
after the first for the end of the archive. Here every header must carry a valid checksum,
extended headers are capped, and a stream that ends before its end-of-archive block is a
truncated one.

Objects that carry no recorded format are recognised by :mod:`.sniff`; :mod:`.listing` lists
members without extracting; :mod:`.limits` holds the caps on what one extraction may cost.
"""

from flyte_checkpoint.archive.compression import DEFAULT_COMPRESSION_LEVEL, HAVE_ISAL
from flyte_checkpoint.archive.extract import safe_file_mode, unpack_archive
from flyte_checkpoint.archive.limits import ExtractionLimits
from flyte_checkpoint.archive.listing import MemberInfo, MemberKind, list_members
from flyte_checkpoint.archive.pack import (
    TreeEntry,
    content_size,
    describe_mode,
    pack_directory,
    walk_tree,
)
from flyte_checkpoint.archive.prefixed import PrefixedReader
from flyte_checkpoint.archive.sniff import SNIFF_BYTES, ObjectKind, sniff_kind

__all__ = [
    "DEFAULT_COMPRESSION_LEVEL",
    "HAVE_ISAL",
    "SNIFF_BYTES",
    "ExtractionLimits",
    "MemberInfo",
    "MemberKind",
    "ObjectKind",
    "PrefixedReader",
    "TreeEntry",
    "content_size",
    "describe_mode",
    "list_members",
    "pack_directory",
    "safe_file_mode",
    "sniff_kind",
    "unpack_archive",
    "walk_tree",
]
