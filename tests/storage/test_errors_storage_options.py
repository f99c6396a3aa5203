"""A storage option the store does not know is a configuration error naming it."""

from __future__ import annotations

import pytest

from flyte_checkpoint import Checkpoint, ConfigurationError
from tests.storage.conftest import Remote, remote_for


@pytest.fixture
def s3_remote(request: pytest.FixtureRequest) -> Remote:
    return remote_for("s3", request.getfixturevalue("s3_server"))


def _with_typo(remote: Remote) -> Checkpoint:
    options = {**remote.storage_options, "endpoint_urll": "http://127.0.0.1:1"}
    return Checkpoint(remote.uri("ckpt"), remote.uri("prev"), storage_options=options)


def test_saving_with_an_unknown_s3_option_names_the_option_and_the_accepted_ones(s3_remote: Remote) -> None:
    with pytest.raises(ConfigurationError, match=r"'endpoint_urll' is not accepted by s3://") as raised:
        _with_typo(s3_remote).save_sync(b"state")
    assert "endpoint_url," in str(raised.value)
    assert "retries" in str(raised.value)  # this package's own option is listed too


def test_loading_with_an_unknown_s3_option_is_the_same_configuration_error(s3_remote: Remote) -> None:
    with pytest.raises(ConfigurationError, match="'endpoint_urll' is not accepted"):
        _with_typo(s3_remote).load_sync()
