"""S3 (and S3-compatible stores) through s3fs's client: parallel part uploads, ranged loads.

Saves and loads move their bytes with :mod:`.parallel` on the S3 adapter of :mod:`.s3_parallel`
(``max_concurrency`` parts or ranges in flight, see :class:`~.parallel.TransferSettings`); the
rest (``info``, copy, listing, deletes) goes through s3fs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import IO, Any, cast

from fsspec.asyn import sync

from flyte_checkpoint.progress import ProgressCallback, ProgressReporter
from flyte_checkpoint.storage.base import ObjectInfo, ObjectWriter, VerifyingReader
from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreProfile, merged_options
from flyte_checkpoint.storage.parallel import TransferSettings
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS
from flyte_checkpoint.storage.s3_parallel import object_info, open_s3_reader, open_s3_writer, pool_options

PROFILE = StoreProfile(
    implementation="s3fs:S3FileSystem",
    extra="s3",
    # Not used for saves and loads (parallel.TransferSettings.part_size is); s3fs's own files
    # (a copy between stores, say) take it.
    block_size=8 << 20,
    metadata_argument="Metadata",
    metadata_at_commit=False,
    server_side_copy=True,
    defaults={
        "config_kwargs": {
            "connect_timeout": 10,
            "read_timeout": 120,
            "retries": {"max_attempts": REQUEST_ATTEMPTS, "mode": "standard"},
        }
    },
    # s3fs's own retry loop repeats botocore's: off (one try), so the budget stays where
    # storage/retry.py says. Set on the instance: its constructor ignores ``retries=``.
    own_options={"retries": 1},
)


class S3Backend(FsspecBackend):
    """S3: parallel saves and loads; ``info`` is one HEAD that includes the metadata."""

    protocol = "s3"
    profile = PROFILE

    def _defaults(self, transfer: TransferSettings) -> Mapping[str, Any]:
        # botocore's pool would make parts beyond its 10 connections queue for one.
        return merged_options(self.profile.defaults, pool_options(transfer))

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        self.fs.retries = int(own["retries"])

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
        # Atomic: the object appears only when CompleteMultipartUpload (or the single PutObject
        # of an object smaller than one part) succeeds in commit(); see parallel.ParallelWriter.
        with self._errors(uri, "saving"):
            return open_s3_writer(
                self.fs,
                uri,
                metadata,
                self.transfer,
                declared_digest=declared_digest,
                declared_size=declared_size,
                progress=progress,
                gate=gate,
                deadline=self.deadline(uri, "saving", declared_size),
            )

    def open_read(self, uri: str, *, progress: ProgressCallback | None = None) -> VerifyingReader | None:
        deadline = self.deadline(uri, "loading")
        with self._errors(uri, "loading"):
            try:
                reader = open_s3_reader(self.fs, uri, self.transfer, deadline=deadline)
            except FileNotFoundError:
                reader = None
        if reader is None:
            deadline.finish()
            return None
        return VerifyingReader(
            cast(IO[bytes], reader),
            reader.info,
            changed_since=self._change_detector(uri, reader.info),
            translate_errors=lambda: self._errors(uri, "loading"),
            progress=progress,
        )

    def info(self, uri: str) -> ObjectInfo | None:
        # One HEAD: s3fs's info() leaves out the user metadata, which cost a second HEAD.
        bucket, key, version_id = self.fs.split_path(uri)
        versioned = {"VersionId": version_id} if version_id else {}
        with self._bounded(uri, "inspecting"):
            try:
                response = sync(
                    self.fs.loop, self.fs._call_s3, "head_object", Bucket=bucket, Key=key, **versioned
                )
            except FileNotFoundError:
                return None
        return object_info(uri, response)
