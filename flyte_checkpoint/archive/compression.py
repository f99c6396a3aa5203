"""Gzip streams for archives: written as indexed gzip members, read in parallel where indexed.

Archives are written by :mod:`.member_writer` (independent gzip members, each deflated or
stored as its content deserves, on several threads) and read by :mod:`.member_reader` when they
carry this package's index, else (older objects, other tools' archives) by one streaming
inflater: python-isal's where installed, else the standard library's.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Any, cast

from flyte_checkpoint.archive import members
from flyte_checkpoint.archive.lanes import Lanes
from flyte_checkpoint.archive.member_reader import IndexedReader
from flyte_checkpoint.archive.member_writer import MemberWriter
from flyte_checkpoint.archive.prefixed import PrefixedReader
from flyte_checkpoint.cpu_quota import usable_cpus
from flyte_checkpoint.errors import CheckpointCorruptError, CheckpointError, ConfigurationError

_isal_gzip: Any
try:  # python-isal's igzip is 5-10x faster than zlib; fall back to the standard library.
    from isal import igzip_threaded as _isal_gzip
    from isal.isal_zlib import error as _isal_error

    _ISAL_ERRORS: tuple[type[BaseException], ...] = (cast(type[BaseException], _isal_error),)
except ImportError:  # pragma: no cover - exercised only where isal has no wheel
    _isal_gzip = None
    _ISAL_ERRORS = ()

HAVE_ISAL = _isal_gzip is not None

DEFAULT_COMPRESSION_LEVEL = 1
CHUNK = 1 << 20
THREADS_ENV = "FLYTE_CHECKPOINT_COMPRESSION_THREADS"
"""Threads that deflate a save and inflate a load (default: the CPUs this process may use)."""
_MAX_THREADS = 1024
# Errors that mean "the bytes are not a valid archive", as opposed to failures of the stream.
FORMAT_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    *_ISAL_ERRORS,
)


def compression_threads(threads: int | None = None) -> int:
    """``threads`` checked, or when ``None`` the setting :data:`THREADS_ENV`, or else the CPUs
    this process may use (:func:`~flyte_checkpoint.cpu_quota.usable_cpus`: the cores it may run
    on, no more than a container's CPU limit).

    Raises :class:`ConfigurationError` for a value that is not a whole number from 1 to 1024.
    """
    source, given = "compression threads", repr(threads)
    if threads is None:
        raw = os.environ.get(THREADS_ENV, "").strip()
        if not raw:
            return usable_cpus()
        source, given = THREADS_ENV, repr(raw)  # the text as set, not what it failed to parse to
        with contextlib.suppress(ValueError):
            threads = int(raw)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= _MAX_THREADS:
        raise ConfigurationError(
            f"{source} must be a whole number from 1 to {_MAX_THREADS}, got {given}; "
            f"fix it, or unset {THREADS_ENV} to use every core this process may run on"
        )
    return threads


@contextlib.contextmanager
def gzip_writer(sink: IO[bytes], level: int, threads: int | None = None) -> Iterator[MemberWriter]:
    """An indexed gzip stream over ``sink``; ``level`` 0 stores, 1 is fastest, 9 compresses most.

    It inflates to what was written followed by :data:`~.members.TAIL_CONTENT` zero bytes (the
    padding a tar reader skips after the end of an archive).

    Blocks that deflate would barely shrink are stored whatever the level (see
    :mod:`.members`). ``threads`` encode (default :func:`compression_threads`). An exception
    inside the block (an interrupt too) abandons the stream: nothing more reaches ``sink`` and
    it does not end on a whole gzip member.
    """
    if not 0 <= level <= 9:
        raise ValueError(f"compression level must be 0 (store) to 9, got {level}")
    writer = MemberWriter(sink, level, compression_threads(threads))
    try:
        yield writer
    except BaseException:
        writer.abandon()
        raise
    writer.close()


@contextlib.contextmanager
def gzip_reader(source: IO[bytes]) -> Iterator[IO[bytes]]:
    """A decompressing stream over ``source`` (threaded igzip where available)."""
    reader: IO[bytes]
    if _isal_gzip is not None:
        reader = _isal_gzip.open(source, "rb", threads=1)
    else:
        reader = cast(IO[bytes], gzip.GzipFile(fileobj=source, mode="rb"))
    try:
        yield reader
    finally:
        reader.close()


@contextlib.contextmanager
def tar_stream(
    source: IO[bytes], *, compressed: bool, threads: int | None = None, pool: Lanes | None = None
) -> Iterator[IO[bytes]]:
    """The plain tar bytes of ``source``, read to its very end on success (so the gzip CRC and
    length, or the index, are checked after the last member); a malformed stream is
    :class:`CheckpointCorruptError`. An indexed archive is inflated on ``pool`` if given, else
    on ``threads`` threads (default :func:`compression_threads`); any other gzip stream on one."""
    try:
        with contextlib.ExitStack() as stack:
            plain = stack.enter_context(_decompressed(source, threads, pool)) if compressed else source
            yield plain
            drain(plain)
    except CheckpointError:
        raise
    except FORMAT_ERRORS as exc:
        raise CheckpointCorruptError(f"damaged archive: {exc}") from exc


@contextlib.contextmanager
def _decompressed(source: IO[bytes], threads: int | None, pool: Lanes | None) -> Iterator[IO[bytes]]:
    head = b""
    while len(head) < members.HEADER_PREFIX and (more := source.read(members.HEADER_PREFIX - len(head))):
        head += more
    if members.is_indexed(head):
        with IndexedReader(source, head, compression_threads(threads), pool) as indexed:
            yield cast(IO[bytes], indexed)  # its read() hands over whole blocks: no buffer needed
        return
    from_start = cast(IO[bytes], io.BufferedReader(PrefixedReader(head, source)))
    with gzip_reader(from_start) as reader:
        yield reader


def drain(stream: IO[bytes]) -> None:
    """Read ``stream`` to its end."""
    while stream.read(CHUNK):
        pass
