"""Google Cloud Storage through gcsfs: resumable uploads, fsspec's read-ahead reads."""

from __future__ import annotations

from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreProfile

PROFILE = StoreProfile(
    implementation="gcsfs:GCSFileSystem",
    extra="gcs",
    block_size=16 << 20,
    metadata_argument="metadata",
    metadata_at_commit=False,
    server_side_copy=True,
    defaults={"requests_timeout": 300},
)


class GCSBackend(FsspecBackend):
    """GCS: everything as :class:`FsspecBackend` does it."""

    protocol = "gs"
    profile = PROFILE
