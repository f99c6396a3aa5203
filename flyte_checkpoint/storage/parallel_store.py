"""An fsspec object store whose saves and loads go through :mod:`.parallel`.

A store module names its adapter (:meth:`ParallelStore.parallel_object`); everything else --
the writer with its progress, pause gate and declared content, the ordered reader and its
error translation -- is the same for every store and lives here once.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping
from typing import IO, Protocol, cast

from flyte_checkpoint.progress import ProgressReporter
from flyte_checkpoint.storage.base import ObjectInfo, ObjectWriter
from flyte_checkpoint.storage.fsspec_store import FsspecBackend
from flyte_checkpoint.storage.parallel import ParallelReader, ParallelWriter, RangeSource, UploadTarget


class StoreObject(UploadTarget, RangeSource, Protocol):
    """One object of a store, as both an upload target and a ranged source."""


class ParallelStore(FsspecBackend):
    """Saves as parallel part uploads, loads as ordered parallel ranged reads (``self.transfer``)."""

    @abc.abstractmethod
    def parallel_object(self, uri: str) -> StoreObject:
        """The store's adapter for the object at ``uri``."""

    def open_write(
        self,
        uri: str,
        metadata: Mapping[str, str],
        *,
        declared_digest: str | None = None,
        declared_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: threading.Event | None = None,
    ) -> ObjectWriter:
        # Atomic: nothing is visible until the store completes the upload in commit().
        writer = ParallelWriter(
            self.parallel_object(uri),
            metadata,
            self.transfer,
            expected_size=declared_size,
            progress=progress,
            gate=gate,
        )
        writer.declare(declared_digest, declared_size)
        return writer

    def _open_stream(self, uri: str) -> tuple[IO[bytes], ObjectInfo] | None:
        with self._errors(uri, "loading"):
            reader = ParallelReader.open(self.parallel_object(uri), self.transfer)
        if reader is None:
            return None
        return cast(IO[bytes], reader), reader.info
