"""S3 (and S3-compatible stores) through s3fs's client: parallel part uploads, ranged loads.

Saves and loads move their bytes with :mod:`.parallel` on the S3 adapter of :mod:`.s3_parallel`
(``max_concurrency`` parts or ranges in flight, see :class:`~.options.TransferSettings`); the
rest (``info``, copy, listing, deletes) goes through s3fs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsspec.asyn import sync

from flyte_checkpoint.storage.base import ObjectInfo
from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreProfile, merged_options
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS
from flyte_checkpoint.storage.s3_parallel import S3Object, object_info, pool_options, s3_settings

PROFILE = StoreProfile(
    implementation="s3fs:S3FileSystem",
    extra="s3",
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
    keeps_unfinished_uploads = True

    def _defaults(self, transfer: TransferSettings) -> Mapping[str, Any]:
        # botocore's pool would make parts beyond its 10 connections queue for one.
        return merged_options(self.profile.defaults, pool_options(transfer))

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        self.fs.retries = int(own["retries"])

    def __init__(self, storage_options: Mapping[str, Any] | None = None) -> None:
        super().__init__(storage_options)
        self.transfer = s3_settings(self.transfer)

    def parallel_object(self, uri: str) -> S3Object:
        return S3Object(self.fs, uri)

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
