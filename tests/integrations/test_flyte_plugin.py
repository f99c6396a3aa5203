"""The Flyte SDK plugin, exercised with real Flyte tasks in the SDK's local mode (offline)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flyte
import flyte._run
import flyte.extend
import flyte.models
import flyte.report
import fsspec
import pytest

import flyte_checkpoint
import flyte_checkpoint.context
import flyte_checkpoint.integrations.flyte as flyte_plugin
import flyte_checkpoint.running
from flyte_checkpoint import CheckpointPaths, ConfigurationError, TaskContext, task_context
from flyte_checkpoint.storage import FORMAT_KEY
from flyte_checkpoint.storage.stores.local import XATTR_NAME, decode_record
from tests.conftest import tree_of
from tests.integrations.examples import EXAMPLES
from tests.integrations.flyte_tasks import (
    SDK_LOCAL_METADATA,
    count_async,
    count_sync,
    describe_bridged_context,
    describe_checkpoint,
    describe_preemption_handler,
    describe_typed_accessor,
    fail_on_the_first_attempt,
    grow_directory,
    run_locally,
    starts_logged,
    train_the_pytorch_example,
)
from tests.storage.conftest import remote_for

OURS = "flyte_checkpoint.single.checkpoint.Checkpoint"


# The object-store protocols the SDK hands to obstore in fsspec's registry when it loads its storage.
SDK_CLAIMED_PROTOCOLS = ("s3", "gs", "abfs", "abfss")


def _registered(protocol: str) -> type[Any]:
    """The class fsspec uses for ``protocol`` now, loading its default if none is registered."""
    return fsspec.get_filesystem_class(protocol)  # type: ignore[no-any-return]


@pytest.fixture(scope="module", autouse=True)
def flyte_initialized() -> Iterator[None]:
    """The SDK's offline initialisation, once: no endpoint, local runs only.

    ``flyte.init()`` registers obstore as fsspec's implementation of s3, gs, abfs and abfss for
    the whole process; the registry is put back afterwards, so later tests see fsspec's own.
    """
    before = {protocol: _registered(protocol) for protocol in SDK_CLAIMED_PROTOCOLS}
    flyte.init()
    yield
    for protocol, implementation in before.items():
        fsspec.register_implementation(protocol, implementation, clobber=True)


@pytest.fixture
def installed() -> Iterator[None]:
    flyte_plugin.install()
    try:
        yield
    finally:
        flyte_plugin.uninstall()


@pytest.fixture
def raw_data(tmp_path: Path) -> Path:
    return tmp_path / "raw"


@pytest.mark.usefixtures("installed")
def test_flyte_ctx_checkpoint_is_our_checkpoint_inside_a_task(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_checkpoint))
    assert described["type"] == OURS


@pytest.mark.usefixtures("installed")
def test_the_helper_is_cached_in_the_task_context(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_checkpoint))
    assert described["same_on_second_access"] is True


@pytest.mark.usefixtures("installed")
def test_the_helper_is_built_from_the_sdk_checkpoint_paths(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_checkpoint))
    assert described["destination"] == str(raw_data / "checkpoint")
    assert described["source"] == str(raw_data / "prev_checkpoint")


@pytest.mark.usefixtures("installed")
def test_a_sync_task_with_retries_resumes_from_our_checkpoint(raw_data: Path, tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    assert run_locally(raw_data, count_sync, n=8, fail_every=3, log=str(log)) == 8
    assert starts_logged(log) == [0, 3, 6]


@pytest.mark.usefixtures("installed")
def test_an_async_task_with_retries_resumes_from_our_checkpoint(raw_data: Path, tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    assert run_locally(raw_data, count_async, n=8, fail_every=3, log=str(log)) == 8
    assert starts_logged(log) == [0, 3, 6]


@pytest.mark.usefixtures("installed")
def test_the_object_a_retried_task_resumed_from_was_written_by_us(raw_data: Path, tmp_path: Path) -> None:
    run_locally(raw_data, count_sync, n=4, fail_every=3, log=str(tmp_path / "starts.log"))
    staged = raw_data / "prev_checkpoint"
    assert staged.read_bytes() == b"3"
    assert decode_record(os.getxattr(staged, XATTR_NAME))[FORMAT_KEY] == "payload"


@pytest.mark.usefixtures("installed")
def test_a_directory_checkpoint_resumes_after_a_failed_attempt(raw_data: Path, tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    result = run_locally(
        raw_data, grow_directory, n=5, fail_at=3, workdir=str(tmp_path / "work"), log=str(log)
    )
    assert result == 5
    assert starts_logged(log) == [0, 3]


@pytest.mark.usefixtures("installed")
def test_each_retry_of_a_task_that_keeps_failing_resumes_until_the_retries_are_spent(
    raw_data: Path, tmp_path: Path
) -> None:
    log = tmp_path / "starts.log"
    with pytest.raises(Exception, match="planned failure at 4"):
        run_locally(raw_data, count_sync, n=10, fail_every=1, log=str(log))
    assert starts_logged(log) == [0, 1, 2, 3]


@pytest.mark.usefixtures("installed")
def test_flyte_checkpoint_ctx_sees_the_running_flyte_task_and_shares_its_helper(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_bridged_context))
    assert described["shares_helper"] is True
    assert described["run_name"] == described["sdk_run_name"]
    assert described["action_name"] == described["sdk_action_name"]


@pytest.mark.usefixtures("installed")
def test_each_local_retry_sees_its_own_attempt_number(raw_data: Path, tmp_path: Path) -> None:
    """Local mode sets no FLYTE_ATTEMPT_NUMBER: a task failing on attempt 0 only used to fail every time."""
    log = tmp_path / "attempts.log"
    assert run_locally(raw_data, fail_on_the_first_attempt, log=str(log)) == 1
    assert starts_logged(log) == [0, 1]


@pytest.mark.usefixtures("installed")
def test_the_attempt_numbers_of_a_new_run_start_at_zero(raw_data: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    run_locally(raw_data, fail_on_the_first_attempt, log=str(first))
    run_locally(tmp_path / "raw2", fail_on_the_first_attempt, log=str(second))
    assert starts_logged(first) == starts_logged(second) == [0, 1]


@pytest.mark.usefixtures("installed")
def test_the_pytorch_example_resumes_unchanged_inside_a_flyte_task(raw_data: Path, tmp_path: Path) -> None:
    log = tmp_path / "starts.log"
    result = run_locally(
        raw_data,
        train_the_pytorch_example,
        epochs=4,
        fail_at_epoch=2,
        workdir=str(tmp_path / "w"),
        log=str(log),
    )
    assert result == 3
    assert starts_logged(log) == [0, 2]


def test_in_remote_mode_the_attempt_number_is_the_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "2")
    sdk_context = flyte.models.TaskContext(
        action=flyte.models.ActionID(name="a0", run_name="r1"),
        version="v1",
        raw_data_path=flyte.models.RawDataPath(path="/tmp/raw"),
        output_path="/tmp/out",
        run_base_dir="/tmp/base",
        report=flyte.report.Report(name="a0"),
        mode="remote",
    )
    context = flyte_plugin.task_context_from_flyte(sdk_context)
    assert context is not None
    assert context.attempt_number == sdk_context.attempt_number == 2


@pytest.mark.usefixtures("installed")
def test_the_typed_accessor_returns_the_helper_flyte_ctx_returns(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_typed_accessor))
    assert described == {"type": OURS, "same_as_flyte_ctx": True, "same_as_ctx": True}


def test_the_typed_accessor_works_without_install(raw_data: Path) -> None:
    described = json.loads(run_locally(raw_data, describe_typed_accessor))
    assert described["type"] == OURS


def test_the_typed_accessor_is_none_outside_a_task() -> None:
    assert flyte_plugin.checkpoint() is None


def test_install_replaces_nothing_in_the_context_module_but_registers_a_provider() -> None:
    """The bridge is a registered provider: ctx()'s context variable is no longer swapped out.

    The registry and the context variable are kept in :mod:`flyte_checkpoint.running`, below the
    context module (which only forwards to it)."""
    before = dict(vars(flyte_checkpoint.running))
    flyte_plugin.install()
    try:
        after = vars(flyte_checkpoint.running)
        changed = {name for name, value in after.items() if before.get(name) is not value}
    finally:
        flyte_plugin.uninstall()
    assert changed == {"_providers"}  # the registry, as register_context_provider keeps it


@pytest.mark.usefixtures("installed")
def test_flyte_checkpoint_ctx_is_still_none_outside_any_task() -> None:
    assert flyte_checkpoint.ctx() is None


@pytest.mark.usefixtures("installed")
def test_a_flyte_checkpoint_task_context_still_wins_over_the_bridge(tmp_path: Path) -> None:
    own = TaskContext(checkpoint_paths=CheckpointPaths(checkpoint_path=str(tmp_path / "cp")))
    with task_context(own):
        assert flyte_checkpoint.ctx() is own


@pytest.mark.skipif(
    not hasattr(flyte.models.TaskContext, "restart_attempt"),
    reason="this flyte version has no JobSet restarts (TaskContext.restart_attempt)",
)
@pytest.mark.usefixtures("installed")
def test_a_jobset_restart_restores_from_this_attempts_own_destination(
    raw_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBSET_RESTART_ATTEMPT", "1")
    described = json.loads(run_locally(raw_data, describe_checkpoint))
    assert described["source"] == described["destination"] == str(raw_data / "checkpoint")


def test_uninstall_brings_back_the_sdk_helper(raw_data: Path) -> None:
    original = flyte.models.TaskContext.__dict__["checkpoint"]
    flyte_plugin.install()
    flyte_plugin.uninstall()
    assert flyte.models.TaskContext.__dict__["checkpoint"] is original
    described = json.loads(run_locally(raw_data, describe_checkpoint))
    assert described["type"] == f"{flyte.Checkpoint.__module__}.{flyte.Checkpoint.__qualname__}"


def test_uninstall_removes_the_flyte_checkpoint_ctx_bridge(raw_data: Path) -> None:
    flyte_plugin.install()
    flyte_plugin.uninstall()
    assert json.loads(run_locally(raw_data, describe_bridged_context)) is None


def test_install_and_uninstall_are_idempotent() -> None:
    original = flyte.models.TaskContext.__dict__["checkpoint"]
    flyte_plugin.install()
    installed_property = flyte.models.TaskContext.__dict__["checkpoint"]
    flyte_plugin.install()
    assert flyte.models.TaskContext.__dict__["checkpoint"] is installed_property
    assert flyte_plugin.is_installed()
    flyte_plugin.uninstall()
    flyte_plugin.uninstall()
    assert not flyte_plugin.is_installed()
    assert flyte.models.TaskContext.__dict__["checkpoint"] is original


def test_install_wraps_the_execute_of_function_tasks_and_uninstall_puts_it_back() -> None:
    original = flyte.extend.AsyncFunctionTaskTemplate.__dict__["execute"]
    flyte_plugin.install()
    try:
        wrapped = flyte.extend.AsyncFunctionTaskTemplate.__dict__["execute"]
    finally:
        flyte_plugin.uninstall()
    assert wrapped is not original
    assert wrapped.__wrapped__ is original
    assert flyte.extend.AsyncFunctionTaskTemplate.__dict__["execute"] is original


def test_install_wraps_the_local_run_entries_and_uninstall_puts_them_back() -> None:
    runner_run, run = flyte._run._Runner.__dict__["run"], flyte.run
    flyte_plugin.install()
    try:
        wrapped = (flyte._run._Runner.__dict__["run"], flyte.run, flyte._run.run)
        assert pickle.loads(pickle.dumps(flyte.run)) is flyte.run  # by reference, as the SDK's
    finally:
        flyte_plugin.uninstall()
    assert wrapped[0] is not runner_run
    assert wrapped[1] is wrapped[2] is not run
    assert (flyte._run._Runner.__dict__["run"], flyte.run, flyte._run.run) == (runner_run, run, run)


def test_a_local_run_from_the_main_thread_has_the_preemption_handler_and_restores_the_previous(
    raw_data: Path,
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    flyte_plugin.install()
    try:
        assert json.loads(run_locally(raw_data, describe_preemption_handler)) is True
    finally:
        flyte_plugin.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before


def test_install_refuses_a_grace_period_that_is_not_a_number_of_seconds() -> None:
    with pytest.raises(ConfigurationError, match="grace_seconds"):
        flyte_plugin.install(grace_seconds=-1)
    assert not flyte_plugin.is_installed()


def test_install_adds_the_property_to_an_sdk_that_has_none(
    raw_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(flyte.models.TaskContext, "checkpoint")
    flyte_plugin.install()
    try:
        described = json.loads(run_locally(raw_data, describe_checkpoint))
    finally:
        flyte_plugin.uninstall()
    assert described["type"] == OURS
    assert "checkpoint" not in flyte.models.TaskContext.__dict__


def test_install_refuses_an_sdk_without_checkpoint_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OldTaskContext:  # the shape of flyte < 2.1.3: `checkpoints`, no `checkpoint_paths`
        checkpoints: object = None

    monkeypatch.setattr(flyte.models, "TaskContext", OldTaskContext)
    with pytest.raises(ConfigurationError, match="no checkpoint_paths"):
        flyte_plugin.install()
    assert not flyte_plugin.is_installed()


def test_the_installed_sdk_is_in_the_supported_range() -> None:
    release = flyte_plugin._release(importlib.metadata.version("flyte"))
    assert release >= flyte_plugin._FIRST_SUPPORTED
    assert release[:2] < flyte_plugin._FIRST_UNTESTED


def test_the_flyte_extra_pins_the_supported_range() -> None:
    requirements = importlib.metadata.requires("flyte-checkpoint") or []
    (pin,) = [r for r in requirements if r.startswith("flyte") and 'extra == "flyte"' in r]
    clauses = pin.split(";")[0].removeprefix("flyte").replace(" ", "").split(",")
    assert sorted(clauses) == sorted(flyte_plugin.SUPPORTED_FLYTE_VERSIONS.split(","))


def test_the_example_task_resumes_after_each_planned_failure(tmp_path: Path) -> None:
    name = f"fc-example-{uuid.uuid4().hex[:12]}"
    try:
        result = subprocess.run(
            [
                sys.executable,
                str(EXAMPLES / "flyte_task.py"),
                "-n",
                "10",
                "--fail-every",
                "4",
                "--run-name",
                name,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(SDK_LOCAL_METADATA / name, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    resumed = [line for line in result.stdout.splitlines() if ": resumed from checkpoint at" in line]
    assert resumed == [
        "attempt 0: resumed from checkpoint at nothing: starting at 0",
        "attempt 1: resumed from checkpoint at 4",
        "attempt 2: resumed from checkpoint at 8",
    ]
    assert result.stdout.strip().endswith("result: 10")


# -- one format: what the SDK's own helper writes loads with ours, and the other way round ----------


def test_a_directory_saved_by_the_sdk_helper_loads_with_ours(tmp_path: Path, model_dir: Path) -> None:
    flyte.Checkpoint(str(tmp_path / "object")).save_sync(model_dir)
    with flyte_checkpoint.Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as ours:
        restored = ours.load_sync()
        assert restored == ours.path
        assert tree_of(restored) == tree_of(model_dir)


def test_bytes_saved_by_the_sdk_helper_load_with_ours_as_payload(tmp_path: Path) -> None:
    flyte.Checkpoint(str(tmp_path / "object")).save_sync(b"state from the sdk")
    with flyte_checkpoint.Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as ours:
        restored = ours.load_sync()
        assert restored == ours.path / "payload"
        assert restored.read_bytes() == b"state from the sdk"


def test_a_directory_saved_by_ours_loads_with_the_sdk_helper(tmp_path: Path, model_dir: Path) -> None:
    with flyte_checkpoint.Checkpoint(str(tmp_path / "object")) as ours:
        ours.save_sync(model_dir)
    sdk = flyte.Checkpoint(str(tmp_path / "next"), str(tmp_path / "object"))
    restored = sdk.load_sync()
    assert restored == sdk.path
    assert tree_of(restored) == tree_of(model_dir)


def test_bytes_saved_by_ours_load_with_the_sdk_helper_as_payload(tmp_path: Path) -> None:
    with flyte_checkpoint.Checkpoint(str(tmp_path / "object")) as ours:
        ours.save_sync(b"state from flyte_checkpoint")
    sdk = flyte.Checkpoint(str(tmp_path / "next"), str(tmp_path / "object"))
    restored = sdk.load_sync()
    assert restored == sdk.path / "payload"
    assert restored.read_bytes() == b"state from flyte_checkpoint"


def test_an_sdk_save_over_an_object_ours_wrote_loads_with_ours(tmp_path: Path) -> None:
    with flyte_checkpoint.Checkpoint(str(tmp_path / "object")) as ours:
        ours.save_sync(b"saved by flyte_checkpoint first")
    flyte.Checkpoint(str(tmp_path / "object")).save_sync(b"then by the sdk")
    with flyte_checkpoint.Checkpoint(str(tmp_path / "next"), str(tmp_path / "object")) as ours:
        restored = ours.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"then by the sdk"


@pytest.mark.parametrize(
    ("backend", "server_fixture"), [("s3", "s3_server"), ("gcs", "gcs_server"), ("azure", "azure_server")]
)
def test_a_checkpoint_on_object_storage_works_in_a_process_that_runs_flyte(
    backend: str, server_fixture: str, request: pytest.FixtureRequest
) -> None:
    """flyte.init() makes obstore fsspec's s3/gs/abfs for the process; ours must not go through it."""
    remote = remote_for(backend, request.getfixturevalue(server_fixture))
    assert _registered(remote.scheme).__module__.startswith("obstore")  # what flyte.init() left
    with flyte_checkpoint.Checkpoint(remote.uri("object"), storage_options=remote.storage_options) as writer:
        writer.save_sync(b"state")
    with flyte_checkpoint.Checkpoint(
        remote.uri("next"), remote.uri("object"), storage_options=remote.storage_options
    ) as reader:
        restored = reader.load_sync()
        assert restored is not None
        assert restored.read_bytes() == b"state"


def test_install_hands_its_transfer_settings_to_every_task_helper(raw_data: Path) -> None:
    flyte_plugin.install(transfer=flyte_checkpoint.TransferSettings(fsync=True))
    try:
        described = json.loads(run_locally(raw_data, describe_checkpoint))
    finally:
        flyte_plugin.uninstall()
    assert described["fsync"] is True


def test_install_refuses_transfer_settings_given_as_a_dict_and_installs_nothing() -> None:
    with pytest.raises(ConfigurationError, match=r"write transfer=TransferSettings\(fsync=True\)"):
        flyte_plugin.install(transfer={"fsync": True})  # type: ignore[arg-type]
    assert not flyte_plugin.is_installed()
