"""Configuration mistakes are ConfigurationError naming the option and what is accepted, on every
backend, before any client reaches a network; every Azure credential kind gets the bounded client."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointUnavailableError, ConfigurationError, RetryPolicy

LOCATIONS = {
    "local": "LOCAL",
    "s3": "s3://bucket/ckpt",
    "gs": "gs://bucket/ckpt",
    "abfs": "abfs://container/ckpt",
}
BASE_OPTIONS: dict[str, dict[str, Any]] = {
    "local": {},
    "s3": {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"},
    "gs": {"token": "anon", "endpoint_url": "http://127.0.0.1:9"},
    "abfs": {
        "connection_string": "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/a;"
    },
}


def helper(backend: str, tmp_path: Path, **options: Any) -> Checkpoint:
    dest = str(tmp_path / "ckpt") if backend == "local" else LOCATIONS[backend]
    return Checkpoint(dest, storage_options={**BASE_OPTIONS[backend], **options})


@pytest.mark.parametrize("backend", list(LOCATIONS))
def test_a_misspelt_option_is_refused_naming_it_and_the_closest_accepted_one(
    backend: str, tmp_path: Path
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"'max_concurency'.*did you mean 'max_concurrency'.*Accepted:"
    ):
        helper(backend, tmp_path, max_concurency=4)


@pytest.mark.parametrize("backend", list(LOCATIONS))
@pytest.mark.parametrize(
    ("option", "value"),
    [("part_size", 1000), ("max_concurrency", "lots"), ("transfer_timeout", -1)],
)
def test_an_invalid_transfer_setting_is_refused_naming_it_and_its_value(
    backend: str, option: str, value: object, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match=rf"storage option '{option}'={value!r}"):
        helper(backend, tmp_path, **{option: value})


def test_the_accepted_list_of_s3_names_the_transfer_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        helper("s3", tmp_path, nonsense=1)
    for name in ("part_size", "file_concurrency", "transfer_timeout", "stale_upload_age", "endpoint_url"):
        assert name in str(refused.value)


def test_a_malformed_azure_connection_string_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="connection_string"):
        Checkpoint("abfs://container/ckpt", storage_options={"connection_string": "not a connection string"})


def test_an_azure_account_name_without_credentials_or_host_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="abfs://"):
        Checkpoint("abfs://container/ckpt", storage_options={"account_name": ""})


def test_a_gcs_token_naming_a_missing_file_is_refused_before_any_client_is_built(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-key.json"
    with pytest.raises(ConfigurationError, match=r"'token' names .*no-such-key\.json.*does not exist"):
        Checkpoint("gs://bucket/ckpt", storage_options={"token": str(missing)})


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class StaticToken:
    """A credential object as azure-identity's are (get_token), for a host that is not there."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("token", int(time.time()) + 3600)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> StaticToken:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None


@pytest.mark.parametrize("kind", ["connection_string", "account_key", "sas_token", "credential", "anonymous"])
def test_every_azure_credential_kind_gives_up_on_an_unreachable_host_within_bounds(kind: str) -> None:
    host = f"127.0.0.1:{closed_port()}"
    account: dict[str, Any] = {"account_name": "devstoreaccount1", "account_host": host}
    kinds: dict[str, dict[str, Any]] = {
        "connection_string": {
            "connection_string": f"DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://{host}/a;"
        },
        # On 127.0.0.1 the SDK reads a shared key's account name from the URL's path.
        "account_key": {**account, "account_host": f"{host}/devstoreaccount1", "account_key": "a2V5"},
        "sas_token": {**account, "sas_token": "sv=2024-01-01&sig=x"},
        "credential": {**account, "credential": StaticToken()},
        "anonymous": {**account, "anon": True},
    }
    # One try per request: the bound under test is our client's, which the SDK's ignores.
    options = {**kinds[kind], "retry_total": 0}
    started = time.monotonic()
    with pytest.raises(CheckpointUnavailableError):
        Checkpoint("abfs://container/ckpt", storage_options=options, retry=RetryPolicy(attempts=1)).save_sync(
            b"x"
        )
    assert time.monotonic() - started < 60  # the SDK's own policy took about 86 s per attempt
