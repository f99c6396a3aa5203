"""URI cleaning, scheme checks and the previous-attempt URI repair rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from flyte_checkpoint import (
    Checkpoint,
    ConfigurationError,
    TaskContext,
    UnsupportedURIError,
    repair_prev_checkpoint_uri,
    task_context,
)
from flyte_checkpoint.uris import check_supported, clean_uri, local_path

RUN = "run-abc"
ACTION = "train"


def uri(scheme: str, attempt: int) -> str:
    return f"{scheme}://bucket/metadata/{RUN}/{ACTION}/{attempt}/prev_checkpoint"


def repair(value: str) -> str:
    return repair_prev_checkpoint_uri(value, run_name=RUN, action_name=ACTION)


@pytest.mark.parametrize("scheme", ["s3", "gs", "gcs", "s3a", "abfss", "az"])
def test_each_remote_scheme_gets_the_attempt_segment_decremented(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "3")
    assert repair(uri(scheme, 3)) == uri(scheme, 2)


@pytest.mark.parametrize("scheme", ["file", "abfs"])
def test_other_schemes_are_left_unchanged(scheme: str) -> None:
    assert repair(uri(scheme, 3)) == uri(scheme, 3)


def test_a_plain_local_path_is_left_unchanged() -> None:
    value = f"/data/{RUN}/{ACTION}/3/prev"
    assert repair(value) == value


@pytest.mark.parametrize("attempt", [0, 1])
def test_attempt_segments_of_one_or_less_are_left_unchanged(attempt: int) -> None:
    assert repair(uri("s3", attempt)) == uri("s3", attempt)


def test_a_uri_without_the_run_and_action_segment_is_left_unchanged() -> None:
    assert repair("s3://bucket/other/run/3/prev") == "s3://bucket/other/run/3/prev"


def test_without_run_or_action_names_nothing_is_repaired() -> None:
    assert repair_prev_checkpoint_uri(uri("s3", 3)) == uri("s3", 3)
    assert repair_prev_checkpoint_uri(uri("s3", 3), run_name=RUN) == uri("s3", 3)


@pytest.mark.parametrize("env_attempt", ["3", "2"])
def test_a_segment_matching_the_attempt_number_or_one_more_is_repaired(
    monkeypatch: pytest.MonkeyPatch, env_attempt: str
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", env_attempt)
    assert repair(uri("gs", 3)) == uri("gs", 2)


def test_a_segment_not_matching_the_attempt_number_is_left_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "5")
    assert repair(uri("s3", 3)) == uri("s3", 3)


def test_attempt_number_zero_leaves_a_segment_above_one_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "0")
    assert repair(uri("az", 7)) == uri("az", 7)


def test_without_an_attempt_number_a_correct_previous_uri_is_left_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLYTE_ATTEMPT_NUMBER", raising=False)
    assert repair(uri("s3", 5)) == uri("s3", 5)


def test_names_with_regex_characters_are_matched_literally() -> None:
    value = "s3://b/x/run.1/act+x/3/prev"

    def repaired(uri: str) -> str:
        return repair_prev_checkpoint_uri(uri, run_name="run.1", action_name="act+x", attempt_number=3)

    assert repaired(value) == "s3://b/x/run.1/act+x/2/prev"
    assert repaired("s3://b/x/runX1/act+x/3/p") == "s3://b/x/runX1/act+x/3/p"


def helper_source(prev_uri: str) -> str | None:
    """The previous URI as a helper made in the current task repairs it (anonymous clients: gcsfs
    would otherwise look for credentials, on Google's metadata server among other places)."""
    options = {"token": "anon"} if prev_uri.startswith("gs://") else {"anon": True}
    return Checkpoint(
        "file:///tmp/unused-dest", prev_uri, run_name=RUN, action_name=ACTION, storage_options=options
    ).remote_source


def test_inside_a_task_the_helper_repairs_with_the_context_attempt_number_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "5")
    with task_context(TaskContext(attempt_number=3)):
        assert helper_source(uri("s3", 3)) == uri("s3", 2)


def test_a_helper_in_a_task_context_without_an_attempt_number_in_the_environment_still_repairs() -> None:
    """Under the retry runners and Flyte's local mode FLYTE_ATTEMPT_NUMBER is unset."""
    with task_context(TaskContext(attempt_number=5)):
        assert helper_source(uri("gs", 3)) == uri("gs", 3)  # segment 3 is not attempt 5 or 6
        assert helper_source(uri("gs", 5)) == uri("gs", 4)


def test_an_explicit_attempt_number_wins_over_the_task_context() -> None:
    with task_context(TaskContext(attempt_number=5)):
        assert repair_prev_checkpoint_uri(
            uri("s3", 3), run_name=RUN, action_name=ACTION, attempt_number=2
        ) == uri("s3", 2)


def test_a_malformed_attempt_number_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "1.5")
    with pytest.raises(ConfigurationError, match="not an integer"):
        repair(uri("s3", 3))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), ("", None), ("  ", None), ('"s3://b/k"', "s3://b/k"), (" 's3://b/k' ", "s3://b/k")],
)
def test_clean_uri_strips_whitespace_and_quotes(raw: str | None, expected: str | None) -> None:
    assert clean_uri(raw) == expected


@pytest.mark.parametrize("value", ["ftp://h/x", "http://h/x", "hdfs://n/x"])
def test_unsupported_schemes_are_refused(value: str) -> None:
    with pytest.raises(UnsupportedURIError, match="unsupported storage URI"):
        check_supported(value)


def test_file_uris_map_to_local_paths(tmp_path: Path) -> None:
    assert local_path((tmp_path / "a b").as_uri()) == tmp_path / "a b"


def test_file_uris_with_a_remote_host_are_refused() -> None:
    with pytest.raises(UnsupportedURIError, match="host"):
        local_path("file://server/share/x")


@pytest.mark.parametrize("value", ["s3:///key", "gs:///run/checkpoint", "abfs:///run/checkpoint", "s3://"])
def test_a_remote_uri_without_a_bucket_is_refused_by_backend_for(value: str) -> None:
    from flyte_checkpoint.storage import backend_for

    with pytest.raises(UnsupportedURIError, match="names no bucket or container"):
        backend_for(value)


@pytest.mark.parametrize(
    "value", ["s3://bucket", "s3://bucket/", "gs://bucket", "gs://bucket/", "abfs://container", "az://c/"]
)
def test_a_checkpoint_at_a_whole_bucket_is_refused_at_construction(value: str) -> None:
    from flyte_checkpoint import Checkpoint

    with pytest.raises(UnsupportedURIError, match="names the whole bucket"):
        Checkpoint(value)


@pytest.mark.parametrize("value", ["s3:///run/checkpoint", "gs:///run/checkpoint", "abfs:///run/ckpt"])
def test_a_checkpoint_without_a_bucket_is_refused_at_construction(value: str) -> None:
    from flyte_checkpoint import Checkpoint

    with pytest.raises(UnsupportedURIError, match="names no bucket or container"):
        Checkpoint("/tmp/unused-destination", value)


@pytest.mark.parametrize("value", ["s3://bucket/run/ckpt/", "gs://bucket/run/ckpt/", "abfs://c/run/ckpt/"])
def test_a_remote_checkpoint_uri_with_a_trailing_slash_is_refused_naming_the_fix(value: str) -> None:
    from flyte_checkpoint import Checkpoint

    with pytest.raises(UnsupportedURIError, match=r"drop the trailing slash \(.*/run/ckpt\)"):
        Checkpoint(value)
    with pytest.raises(UnsupportedURIError, match="ends in '/'"):
        Checkpoint("/tmp/unused-destination", value)


def test_inspecting_a_remote_uri_with_a_trailing_slash_is_refused() -> None:
    from flyte_checkpoint.single.inspection import inspect_object

    with pytest.raises(UnsupportedURIError, match="ends in '/'"):
        inspect_object("s3://bucket/run/ckpt/")


def test_an_azure_uri_naming_its_account_keeps_the_container_as_its_bucket() -> None:
    from flyte_checkpoint.uris import check_object_uri

    assert check_object_uri("abfs://container@account.dfs.core.windows.net/run/ckpt") == "abfs"


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_uri_is_refused_rather_than_read_as_the_current_directory(value: str) -> None:
    from flyte_checkpoint.single.inspection import inspect_object
    from flyte_checkpoint.storage import backend_for

    with pytest.raises(UnsupportedURIError, match="the storage URI is empty"):
        inspect_object(value)
    with pytest.raises(UnsupportedURIError, match="the storage URI is empty"):
        backend_for(value)


@pytest.mark.parametrize("value", ["s3://bu cket/k", "gs://bucket!/k", "s3://.bucket/k", "az://con tainer/k"])
def test_a_bucket_name_no_store_accepts_is_refused_at_construction(value: str) -> None:
    with pytest.raises(UnsupportedURIError, match=r"which is not a valid (bucket|container) name"):
        Checkpoint(value)


@pytest.mark.parametrize(
    "value",
    [
        "s3://my-bucket.v2_old/run/ckpt",
        "s3://arn:aws:s3:us-east-1:123456789012:accesspoint/my-point/run/ckpt",
        "abfs://$root/run/ckpt",
        "abfs://container@account.dfs.core.windows.net/run/ckpt",
    ],
)
def test_bucket_names_the_stores_accept_pass_the_check(value: str) -> None:
    from flyte_checkpoint.uris import check_object_uri

    assert check_object_uri(value) == value.partition("://")[0]


@pytest.mark.parametrize("spelling", ["path", "file-uri"])
def test_a_local_checkpoint_location_with_a_trailing_slash_is_refused_naming_the_fix(
    spelling: str, tmp_path: Path
) -> None:
    location = f"{tmp_path / 'ckpt'}/" if spelling == "path" else f"{(tmp_path / 'ckpt').as_uri()}/"
    with pytest.raises(UnsupportedURIError, match=r"drop the trailing slash"):
        Checkpoint(location)
    with pytest.raises(UnsupportedURIError, match="ends in '/'"):
        Checkpoint(str(tmp_path / "other"), location)
