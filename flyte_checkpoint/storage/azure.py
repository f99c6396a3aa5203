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
    # Every credential kind adlfs knows gets the same bounded client: a connection string; an
    # account URL with a key or a credential object (DefaultAzureCredential, a service
    # principal); with a SAS token; or anonymous. A SAS client kept the SDK's policy and took
    # 7 minutes to give up on an unreachable host.
    connection_string = getattr(fs, "connection_string", None)
    if connection_string:
        fs.service_client = BlobServiceClient.from_connection_string(connection_string, **bounds)
        return
    account_url = getattr(fs, "account_url", None)
    if not account_url:
        return  # adlfs could not build a client either; its own error stands
    credential = getattr(fs, "credential", None) or getattr(fs, "account_key", None)
    sas_token = getattr(fs, "sas_token", None)
    if credential is None and sas_token:
        account_url += sas_token if sas_token.startswith("?") else f"?{sas_token}"
    fs.service_client = BlobServiceClient(account_url, credential=credential, **bounds)
