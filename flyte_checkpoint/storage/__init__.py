"""Moving bytes to and from storage, one object at a time, atomically.

This package knows nothing of archive formats. It offers, for any supported URI, an atomic
writer (nothing is visible until commit), a streaming reader that verifies the recorded digest
at end of stream, object info, and copy. Local paths use the OS directly; everything else goes
through fsspec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyte_checkpoint.storage.base import (
    DIGEST_KEY,
    FORMAT_KEY,
    SIZE_KEY,
    Backend,
    ObjectInfo,
    ObjectWriter,
    VerifyingReader,
    copy_stream,
)
from flyte_checkpoint.storage.local import LocalBackend
from flyte_checkpoint.uris import check_supported, is_local

StorageOptions = Mapping[str, Any]

__all__ = [
    "DIGEST_KEY",
    "FORMAT_KEY",
    "SIZE_KEY",
    "Backend",
    "ObjectInfo",
    "ObjectWriter",
    "StorageOptions",
    "VerifyingReader",
    "backend_for",
    "copy_object",
]

_LOCAL = LocalBackend()


def backend_for(uri: str, storage_options: StorageOptions | None = None) -> Backend:
    """The backend that serves ``uri``; raises a clear error for unsupported schemes."""
    check_supported(uri)
    if is_local(uri):
        return _LOCAL
    from flyte_checkpoint.storage.remote import FsspecBackend, backend_protocol

    return FsspecBackend(backend_protocol(uri), storage_options)


def copy_object(
    src: str,
    dst: str,
    *,
    src_options: StorageOptions | None = None,
    dst_options: StorageOptions | None = None,
) -> bool:
    """Copy the object at ``src`` to ``dst`` atomically; ``False`` when ``src`` does not exist.

    Within one object store the copy happens server-side; otherwise the bytes stream through
    this process into an atomic write, verified against ``src``'s recorded digest.
    """
    source = backend_for(src, src_options)
    target = backend_for(dst, dst_options)
    if source is target or (
        not isinstance(source, LocalBackend)
        and type(source) is type(target)
        and getattr(source, "fs", None) is getattr(target, "fs", None)
    ):
        if source.info(src) is None:
            return False
        source.copy(src, dst)
        return True
    reader = source.open_read(src)
    if reader is None:
        return False
    copy_stream(reader, target, dst)
    return True
