"""Object stores through fsspec: one streamed upload per object, discarded on any failure."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import IO, Any

import fsspec

from flyte_checkpoint.errors import BackendNotInstalledError
from flyte_checkpoint.storage.base import Backend, ObjectInfo, ObjectWriter, VerifyingReader
from flyte_checkpoint.storage.errors import translated_os_errors
from flyte_checkpoint.uris import scheme_of

# The extra that installs each scheme's fsspec implementation.
EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "abfs": "azure",
    "abfss": "azure",
    "az": "azure",
}
_BLOCK_SIZE = 16 << 20


class FsspecWriter(ObjectWriter):
    """A streamed upload that only becomes an object when :meth:`commit` completes it.

    Atomicity: object stores publish an object only when its single PUT or its multipart upload
    completes. fsspec's ``__exit__`` calls ``close()``, which *completes* the upload even when the
    block raised, so this writer never uses ``with``: a failure calls ``discard()``, which aborts
    the multipart upload and leaves the previous object in place.
    """

    def __init__(self, uri: str, handle: Any, metadata: Mapping[str, str]) -> None:
        super().__init__(uri)
        self.metadata.update(metadata)
        self._handle = handle

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        with translated_os_errors(self.uri, "saving"):
            self._handle.write(data)

    def _commit(self) -> None:
        with translated_os_errors(self.uri, "saving"):
            self._handle.close()

    def _abort(self) -> None:
        with contextlib.suppress(Exception):
            self._handle.discard()


class FsspecBackend(Backend):
    """Any fsspec filesystem reached by a URI scheme, with explicit ``storage_options``."""

    def __init__(self, protocol: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.protocol = protocol
        try:
            self.fs = fsspec.filesystem(protocol, **dict(storage_options or {}))
        except ImportError as exc:
            extra = EXTRAS.get(protocol, "all")
            raise BackendNotInstalledError(
                f"{protocol}:// storage needs an fsspec backend that is not installed ({exc}); "
                f"install it with: pip install 'flyte-checkpoint[{extra}]'"
            ) from exc

    def open_write(self, uri: str, metadata: Mapping[str, str]) -> ObjectWriter:
        with translated_os_errors(uri, "saving"):
            handle = self.fs.open(uri, "wb", block_size=_BLOCK_SIZE)
        return FsspecWriter(uri, handle, metadata)

    def open_read(self, uri: str) -> VerifyingReader | None:
        info = self.info(uri)
        if info is None:
            return None
        with translated_os_errors(uri, "loading"):
            stream: IO[bytes] = self.fs.open(uri, "rb", block_size=_BLOCK_SIZE, cache_type="none")
        return VerifyingReader(stream, info)

    def info(self, uri: str) -> ObjectInfo | None:
        with translated_os_errors(uri, "inspecting"):
            try:
                details = self.fs.info(uri)
            except FileNotFoundError:
                return None
        return ObjectInfo(uri=uri, size=int(details.get("size") or 0))

    def copy(self, src: str, dst: str) -> None:
        with translated_os_errors(dst, "copying"):
            self.fs.copy(src, dst)

    def delete(self, uri: str) -> None:
        with translated_os_errors(uri, "deleting"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(uri)

    def list_prefix(self, uri: str) -> list[str]:
        with translated_os_errors(uri, "listing"):
            try:
                found = self.fs.find(uri.rstrip("/") + "/")
            except FileNotFoundError:
                return []
        return sorted(self.fs.unstrip_protocol(path) for path in found)

    def delete_prefix(self, uri: str) -> None:
        with translated_os_errors(uri, "deleting"):
            for path in self.fs.find(uri.rstrip("/") + "/"):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(path)


def backend_protocol(uri: str) -> str:
    """The fsspec protocol for ``uri`` (``s3a`` is served by ``s3``)."""
    scheme = scheme_of(uri)
    return "s3" if scheme == "s3a" else scheme
