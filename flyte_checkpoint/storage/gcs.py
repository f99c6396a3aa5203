"""Google Cloud Storage through gcsfs: parallel part uploads composed into the object, parallel
ranged loads pinned to one generation (see :mod:`.gcs_parallel`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreObject, StoreProfile
from flyte_checkpoint.storage.gcs_parallel import GCSObject, is_temporary
from flyte_checkpoint.storage.options import check_gcs_token

PROFILE = StoreProfile(
    implementation="gcsfs:GCSFileSystem",
    extra="gcs",
    # The compose that publishes the object sets its metadata, digest included.
    metadata_at_commit=True,
    server_side_copy=True,
    defaults={"requests_timeout": 300},
)


class GCSBackend(FsspecBackend):
    """GCS: saves and loads in parallel parts; a save's temporary part objects are never listed."""

    protocol = "gs"
    profile = PROFILE
    keeps_unfinished_uploads = True

    def _check_options(self, options: Mapping[str, Any]) -> None:
        check_gcs_token(options)

    def parallel_object(self, uri: str) -> StoreObject:
        return GCSObject(self.fs, uri)

    def list_prefix(self, uri: str) -> list[str]:
        return [listed for listed in super().list_prefix(uri) if not is_temporary(listed)]
