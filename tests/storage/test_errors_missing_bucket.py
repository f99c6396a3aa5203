"""A bucket or container that does not exist is a configuration error, never "no checkpoint"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flyte_checkpoint import Checkpoint, ConfigurationError
from flyte_checkpoint.cli import EXIT_CONFIGURATION, main
from tests.storage.conftest import Remote


def _missing(remote: Remote) -> str:
    return f"{remote.scheme}://no-such-{remote.bucket}/run/checkpoint"


def test_loading_from_a_missing_bucket_raises_a_configuration_error_naming_it(
    remote: Remote, tmp_path: Path
) -> None:
    cp = Checkpoint(tmp_path / "unused", _missing(remote), storage_options=remote.storage_options)
    with pytest.raises(ConfigurationError, match=rf"'no-such-{remote.bucket}' does not exist.*create it"):
        cp.load_sync()


def test_saving_to_a_missing_bucket_raises_a_configuration_error_naming_it(remote: Remote) -> None:
    cp = Checkpoint(_missing(remote), storage_options=remote.storage_options)
    with pytest.raises(ConfigurationError, match=rf"'no-such-{remote.bucket}' does not exist.*saving"):
        cp.save_sync(b"state")


def test_the_error_names_a_container_on_azure_and_a_bucket_elsewhere(remote: Remote) -> None:
    cp = Checkpoint(_missing(remote), storage_options=remote.storage_options)
    with pytest.raises(ConfigurationError) as raised:
        cp.save_sync(b"state")
    noun = "container" if remote.backend == "azure" else "bucket"
    assert str(raised.value).startswith(f"the {noun} ")


def test_verify_of_a_missing_bucket_says_the_bucket_does_not_exist(
    remote: Remote, capsys: pytest.CaptureFixture[str]
) -> None:
    options = [f"-o{key}={json.dumps(value)}" for key, value in remote.storage_options.items()]
    assert main(["verify", "-q", *options, _missing(remote)]) == EXIT_CONFIGURATION
    err = capsys.readouterr().err
    assert "does not exist" in err
    assert "no checkpoint" not in err
