"""Azure Blob Storage through adlfs, with a blob client whose every call is time-bounded: blocks
staged in parallel and committed as one ordered block list, parallel ranged loads pinned to one
ETag (see :mod:`.azure_parallel`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flyte_checkpoint.storage.azure_parallel import AzureBlob
from flyte_checkpoint.storage.fsspec_store import FsspecBackend, StoreObject, StoreProfile
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS

PROFILE = StoreProfile(
    implementation="adlfs:AzureBlobFileSystem",
    extra="azure",
    metadata_at_commit=True,
    server_side_copy=False,
    defaults={"connection_timeout": 10, "read_timeout": 120},
    # adlfs applies its timeouts to a few calls only and keeps the SDK's retry policy (15 s
    # first back-off), so the client is rebuilt with these bounds: see bound_azure_client.
    own_options={"retry_total": REQUEST_ATTEMPTS - 1, "retry_backoff": 1.0},
)


class AzureBackend(FsspecBackend):
    """Azure: blocks staged in parallel, metadata with the block list; the client gets explicit bounds."""

    protocol = "abfs"
    profile = PROFILE

    def parallel_object(self, uri: str) -> StoreObject:
        return AzureBlob(self.fs, uri)

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        bound_azure_client(self.fs, options, own)


def bound_azure_client(fs: Any, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    """Give adlfs a blob client whose every call has a time bound and a short retry budget."""
    from azure.storage.blob.aio import BlobServiceClient

    bounds = {
        "retry_total": int(own["retry_total"]),
        "retry_connect": int(own["retry_total"]),
        "retry_read": int(own["retry_total"]),
        "retry_status": int(own["retry_total"]),
        "initial_backoff": float(own["retry_backoff"]),
        "increment_base": 2,
        "connection_timeout": options["connection_timeout"],
        "read_timeout": options["read_timeout"],
    }
    connection_string = getattr(fs, "connection_string", None)
    if connection_string:
        fs.service_client = BlobServiceClient.from_connection_string(connection_string, **bounds)
    elif getattr(fs, "account_url", None) and (
        getattr(fs, "credential", None) or getattr(fs, "account_key", None)
    ):
        fs.service_client = BlobServiceClient(
            fs.account_url, credential=fs.credential or fs.account_key, **bounds
        )
    # Anonymous or SAS-in-URL access keeps adlfs's own client (and the SDK's retry policy).
