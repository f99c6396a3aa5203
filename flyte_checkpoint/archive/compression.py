"""Gzip streams for archives: python-isal's threaded igzip where installed, else the standard library."""

from __future__ import annotations

import contextlib
import gzip
import tarfile
import zlib
from collections.abc import Iterator
from typing import IO, Any, cast

from flyte_checkpoint.archive import threaded_gzip
from flyte_checkpoint.errors import CheckpointCorruptError, CheckpointError

_isal_gzip: Any
_isal_igzip: Any
try:  # python-isal's igzip is 5-10x faster than zlib; fall back to the standard library.
    from isal import igzip as _isal_igzip
    from isal import igzip_threaded as _isal_gzip
    from isal.isal_zlib import error as _isal_error

    _ISAL_ERRORS: tuple[type[BaseException], ...] = (cast(type[BaseException], _isal_error),)
except ImportError:  # pragma: no cover - exercised only where isal has no wheel
    _isal_gzip = _isal_igzip = None
    _ISAL_ERRORS = ()

HAVE_ISAL = _isal_gzip is not None
_THREADED_SAFE = HAVE_ISAL and threaded_gzip.supports(_isal_gzip)
"""Whether the threaded writer can be finished and abandoned without unbounded waits."""

DEFAULT_COMPRESSION_LEVEL = 1
CHUNK = 1 << 20
# Errors that mean "the bytes are not a valid archive", as opposed to failures of the stream.
FORMAT_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    *_ISAL_ERRORS,
)


@contextlib.contextmanager
def gzip_writer(sink: IO[bytes], level: int) -> Iterator[IO[bytes]]:
    """A gzip stream over ``sink``; ``level`` 0 stores, 1 is fastest, 9 compresses most.

    With python-isal installed, levels 1-9 use its threaded igzip (compression runs beside the
    caller's reads); level 0 and the fallback use the standard library. An exception inside the
    block (an interrupt too) abandons the stream within :data:`~.threaded_gzip.ABANDON_SECONDS`:
    nothing more reaches ``sink`` and no trailer is written.
    """
    if not 0 <= level <= 9:
        raise ValueError(f"compression level must be 0 (store) to 9, got {level}")
    if level and _isal_gzip is not None:
        # ISA-L knows levels 0-3; spread zlib's 1-9 over them.
        # threads=2: compression on one thread, hashing and writing the output on another; the
        # benchmark measured directory saves 25% faster with a core free, no slower without.
        isal_level = (level + 2) // 3
        if _THREADED_SAFE:
            threaded = _isal_gzip.open(sink, "wb", compresslevel=isal_level, threads=2)
            try:
                yield threaded
            except BaseException:  # an interrupt too: never wait on the workers' queues
                threaded_gzip.abandon(threaded)
                raise
            threaded_gzip.finish(threaded)
            return
        writer = cast(IO[bytes], _isal_igzip.IGzipFile(fileobj=sink, mode="wb", compresslevel=isal_level))
    else:
        writer = cast(IO[bytes], gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=level, mtime=0))
    try:
        yield writer
    finally:
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
def tar_stream(source: IO[bytes], *, compressed: bool) -> Iterator[IO[bytes]]:
    """The plain tar bytes of ``source``, read to its very end on success (so the gzip CRC and
    length are checked after the last member); a malformed stream is :class:`CheckpointCorruptError`."""
    try:
        with contextlib.ExitStack() as stack:
            plain = stack.enter_context(gzip_reader(source)) if compressed else source
            yield plain
            drain(plain)
    except CheckpointError:
        raise
    except FORMAT_ERRORS as exc:
        raise CheckpointCorruptError(f"damaged archive: {exc}") from exc


def drain(stream: IO[bytes]) -> None:
    """Read ``stream`` to its end."""
    while stream.read(CHUNK):
        pass
