"""Direct S3 entry points for the parallel-transfer tests: a writer or reader over an
``s3fs.S3FileSystem`` without a backend around it (the package goes through
:class:`~flyte_checkpoint.storage.stores.s3.S3Backend`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyte_checkpoint.progress import ProgressReporter
from flyte_checkpoint.storage.base import WriteGate
from flyte_checkpoint.storage.deadline import TransferBound
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.parallel.reader import ParallelReader
from flyte_checkpoint.storage.parallel.writer import ParallelWriter
from flyte_checkpoint.storage.stores.s3 import S3Object, s3_settings


def open_s3_writer(
    fs: Any,
    uri: str,
    metadata: Mapping[str, str],
    settings: TransferSettings,
    *,
    declared_digest: str | None = None,
    declared_size: int | None = None,
    progress: ProgressReporter | None = None,
    gate: WriteGate | None = None,
    deadline: TransferBound | None = None,
) -> ParallelWriter:
    """An atomic, parallel upload to ``uri`` through ``fs`` (an ``s3fs.S3FileSystem``).

    The arguments after ``settings`` are :meth:`Backend.open_write`'s: a declared digest and
    size travel with the object from the start (S3 takes metadata when an upload begins) and the
    commit refuses content that differs from them. ``deadline`` bounds the whole upload (by
    default the one ``settings`` give).
    """
    return ParallelWriter.opened(
        S3Object(fs, uri),
        metadata,
        s3_settings(settings),
        metadata_at_start=True,
        declared_digest=declared_digest,
        declared_size=declared_size,
        progress=progress,
        gate=gate,
        deadline=deadline,
    )


def open_s3_reader(
    fs: Any, uri: str, settings: TransferSettings, *, deadline: TransferBound | None = None
) -> ParallelReader | None:
    """A parallel, in-order read of the object at ``uri``; ``None`` when there is none."""
    return ParallelReader.open(S3Object(fs, uri), settings, deadline=deadline)
