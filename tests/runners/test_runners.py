"""The retry runners: the spec's counter tasks, local staging, remote paths and the runtime entry."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from typing_extensions import assert_type  # typing.assert_type needs Python 3.11

from flyte_checkpoint import (
    Checkpoint,
    CheckpointPaths,
    CheckpointUnavailableError,
    ConfigurationError,
    InvalidCheckpointInputError,
    TransferSettings,
    checkpoint_paths_for_run,
    ctx,
    load_and_run_task,
    run_output_path,
    run_with_retries,
    run_with_retries_async,
)
from flyte_checkpoint.runners.retries import RUN_DIRECTORY_PREFIX
from tests.faults.proxy import FaultProxy, status
from tests.storage.conftest import Remote, remote_for
from tests.storage.test_faults import options_through
from tests.storage_servers import StorageServer

RETRIES = 3


def current_checkpoint() -> Checkpoint:
    context = ctx()
    assert context is not None
    checkpoint = context.checkpoint
    assert checkpoint is not None
    return checkpoint


def use_checkpoint(n_iterations: int, starts: list[int]) -> int:
    """The spec's synchronous counter task."""
    assert n_iterations > RETRIES
    checkpoint = current_checkpoint()
    path = checkpoint.load_sync()
    prev = None if path is None else path.read_bytes()
    start = 0
    if prev:
        start = int(prev.decode())
    starts.append(start)
    failure_interval = n_iterations // RETRIES
    index = start
    for index in range(start, n_iterations):
        if index > start and index % failure_interval == 0:
            raise RuntimeError(f"Failed at iteration {index}, failure_interval {failure_interval}.")
        checkpoint.save_sync(f"{index + 1}".encode())
    return index


async def use_checkpoint_async(n_iterations: int, starts: list[int]) -> int:
    """The spec's asynchronous counter task."""
    assert n_iterations > RETRIES
    checkpoint = current_checkpoint()
    path = await checkpoint.load()
    prev = None if path is None else path.read_bytes()
    start = 0
    if prev:
        start = int(prev.decode())
    starts.append(start)
    failure_interval = n_iterations // RETRIES
    index = start
    for index in range(start, n_iterations):
        if index > start and index % failure_interval == 0:
            raise RuntimeError(f"Failed at iteration {index}, failure_interval {failure_interval}.")
        await checkpoint.save(f"{index + 1}".encode())
    return index


def test_the_sync_counter_task_resumes_from_each_checkpoint(tmp_path: Path) -> None:
    starts: list[int] = []
    result = run_with_retries(use_checkpoint, 12, starts, retries=RETRIES, checkpoint_dir=tmp_path)
    assert result == 11
    assert starts == [0, 4, 8]


def test_the_async_counter_task_resumes_from_each_checkpoint(tmp_path: Path) -> None:
    starts: list[int] = []
    result = run_with_retries(use_checkpoint_async, 12, starts, retries=RETRIES, checkpoint_dir=tmp_path)
    assert result == 11
    assert starts == [0, 4, 8]


async def test_the_async_runner_runs_both_kinds_of_task_inside_an_event_loop(tmp_path: Path) -> None:
    sync_starts: list[int] = []
    async_starts: list[int] = []
    assert (
        await run_with_retries_async(
            use_checkpoint, 12, sync_starts, retries=RETRIES, checkpoint_dir=tmp_path / "s"
        )
        == 11
    )
    assert (
        await run_with_retries_async(
            use_checkpoint_async, 12, async_starts, retries=RETRIES, checkpoint_dir=tmp_path / "a"
        )
        == 11
    )
    assert sync_starts == async_starts == [0, 4, 8]


async def test_the_sync_runner_explains_itself_when_called_inside_an_event_loop(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="run_with_retries_async") as caught:
        run_with_retries(use_checkpoint_async, 12, [], retries=0, checkpoint_dir=tmp_path)
    caught.value.__context__ = None


def test_each_attempt_sees_its_attempt_number_and_the_environment_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "7")
    seen: list[int] = []

    def task() -> str:
        context = ctx()
        assert context is not None
        seen.append(context.attempt_number)
        if len(seen) < 3:
            raise ValueError("again")
        return "ok"

    assert run_with_retries(task, retries=5, checkpoint_dir=tmp_path) == "ok"
    assert seen == [0, 1, 2]
    assert os.environ["FLYTE_ATTEMPT_NUMBER"] == "7"


def test_two_runners_in_two_threads_each_see_their_own_attempt_numbers(tmp_path: Path) -> None:
    """Runner A's attempt 0 and runner B's attempt 1 run at the same time; neither sees the other's."""
    together = threading.Barrier(2, timeout=30)
    seen: dict[str, list[int]] = {"a": [], "b": []}

    def task(name: str, failures: int) -> None:
        context = ctx()
        assert context is not None
        if len(seen[name]) == failures:  # the attempt that runs alongside the other runner's
            together.wait()
        seen[name].append(context.attempt_number)
        if len(seen[name]) <= failures:
            raise RuntimeError("again")
        together.wait()  # both read their number before either runner moves on

    def run(name: str, retries: int) -> None:
        run_with_retries(task, name, retries, retries=retries, checkpoint_dir=tmp_path / name)

    runners = [threading.Thread(target=run, args=("a", 0)), threading.Thread(target=run, args=("b", 1))]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join()
    assert seen == {"a": [0], "b": [0, 1]}


def test_each_attempt_gets_a_fresh_context_and_helper(tmp_path: Path) -> None:
    helpers: list[Checkpoint] = []

    def task() -> None:
        helpers.append(current_checkpoint())
        if len(helpers) < 2:
            raise ValueError("again")

    run_with_retries(task, retries=1, checkpoint_dir=tmp_path)
    assert helpers[0] is not helpers[1]


def test_checkpoint_locations_are_under_the_checkpoint_dir(tmp_path: Path) -> None:
    def task() -> tuple[str, str | None]:
        checkpoint = current_checkpoint()
        return checkpoint.remote_destination, checkpoint.remote_source

    assert run_with_retries(task, retries=0, checkpoint_dir=tmp_path) == (
        str(tmp_path / "checkpoint"),
        str(tmp_path / "prev_checkpoint"),
    )


def test_the_last_saved_checkpoint_is_staged_as_the_previous_one(tmp_path: Path) -> None:
    def task() -> bytes:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        if restored is None:
            checkpoint.save_sync(b"from attempt 0")
            raise RuntimeError("fail after saving")
        return restored.read_bytes()

    assert run_with_retries(task, retries=1, checkpoint_dir=tmp_path) == b"from attempt 0"
    assert (tmp_path / "prev_checkpoint").read_bytes() == b"from attempt 0"


def test_an_attempt_that_saved_nothing_leaves_the_previous_checkpoint_in_place(tmp_path: Path) -> None:
    restored_values: list[bytes | None] = []

    def task() -> None:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        restored_values.append(None if restored is None else restored.read_bytes())
        if len(restored_values) == 1:
            checkpoint.save_sync(b"only save")
        if len(restored_values) < 3:
            raise RuntimeError("again")

    run_with_retries(task, retries=2, checkpoint_dir=tmp_path)
    assert restored_values == [None, b"only save", b"only save"]


def test_a_directory_checkpoint_is_staged_and_restored_across_attempts(
    tmp_path: Path, model_dir: Path
) -> None:
    from tests.conftest import tree_of

    def task() -> dict[str, bytes | None]:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        if restored is None:
            checkpoint.save_sync(model_dir)
            raise RuntimeError("fail after saving")
        return tree_of(restored)

    assert run_with_retries(task, retries=1, checkpoint_dir=tmp_path / "cp") == tree_of(model_dir)


def test_the_last_error_is_raised_with_every_attempt_chained(tmp_path: Path) -> None:
    count = 0

    def task() -> None:
        nonlocal count
        count += 1
        raise ValueError(f"failure {count}")

    with pytest.raises(ValueError, match="failure 3") as caught:
        run_with_retries(task, retries=2, checkpoint_dir=tmp_path)
    chain = []
    error: BaseException | None = caught.value
    while error is not None:
        chain.append(str(error))
        error = error.__context__
    assert chain == ["failure 3", "failure 2", "failure 1"]
    rendered = "".join(traceback.format_exception(caught.value))
    assert "failure 1" in rendered
    assert "attempt 2 failed; no retries left (retries=2)" in rendered


def test_keyboard_interrupt_is_not_retried(tmp_path: Path) -> None:
    calls = 0

    def task() -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_with_retries(task, retries=3, checkpoint_dir=tmp_path)
    assert calls == 1


@pytest.mark.parametrize("retries", [-1, 1.5, True, "2"])
def test_retries_must_be_a_whole_number(tmp_path: Path, retries: object) -> None:
    with pytest.raises(InvalidCheckpointInputError, match="retries"):
        run_with_retries(lambda: None, retries=retries, checkpoint_dir=tmp_path)  # type: ignore[call-overload]


def test_without_a_checkpoint_dir_a_temporary_one_is_used_and_removed() -> None:
    seen: list[str] = []

    def task() -> None:
        checkpoint = current_checkpoint()
        checkpoint.save_sync(b"x")
        seen.append(checkpoint.remote_destination)

    run_with_retries(task, retries=0)
    assert seen
    assert not Path(seen[0]).parent.exists()


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory runs without a ``checkpoint_dir`` use."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _run_directories(root: Path) -> list[Path]:
    return [path for path in root.glob(f"{RUN_DIRECTORY_PREFIX}*") if path.is_dir()]


def _save_then_interrupt() -> None:
    current_checkpoint().save_sync(b"x")
    raise KeyboardInterrupt


def test_a_run_interrupted_by_ctrl_c_removes_its_temporary_checkpoint_dir(temp_root: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_with_retries(_save_then_interrupt, retries=3)
    assert list(temp_root.iterdir()) == []


async def test_a_cancelled_async_run_removes_its_temporary_checkpoint_dir(temp_root: Path) -> None:
    saved = asyncio.Event()

    async def save_then_wait_forever() -> None:
        await current_checkpoint().save(b"x")
        saved.set()
        await asyncio.Event().wait()

    run = asyncio.ensure_future(run_with_retries_async(save_then_wait_forever, retries=3))
    await saved.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await asyncio.to_thread(os.listdir, temp_root) == []


def test_the_temporary_checkpoint_dir_of_a_killed_run_is_removed_by_the_next_run(temp_root: Path) -> None:
    killed = "import os, signal; from flyte_checkpoint import ctx, run_with_retries\n" + (
        "def task():\n"
        "    ctx().checkpoint.save_sync(b'x' * 1000)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "run_with_retries(task, retries=0)\n"
    )
    env = {**os.environ, "TMPDIR": str(temp_root)}
    ended = subprocess.run([sys.executable, "-c", killed], env=env, timeout=60, check=False)
    assert ended.returncode == -signal.SIGKILL
    (left,) = _run_directories(temp_root)
    assert (left / "checkpoint").is_file()

    run_with_retries(lambda: None, retries=0)
    assert list(temp_root.iterdir()) == []


def test_a_running_run_s_temporary_checkpoint_dir_is_not_removed_by_another_run(temp_root: Path) -> None:
    seen: list[bool] = []

    def outer() -> None:
        current_checkpoint().save_sync(b"x")
        run_with_retries(lambda: None, retries=0)  # a second run, in the same TMPDIR
        seen.append(all((path / "checkpoint").is_file() for path in _run_directories(temp_root)))

    run_with_retries(outer, retries=0)
    assert seen == [True]


def test_workspaces_of_finished_attempts_are_removed(tmp_path: Path) -> None:
    workspaces: list[Path] = []

    def task() -> None:
        workspaces.append(Path(str(current_checkpoint().path)))
        if len(workspaces) < 2:
            raise RuntimeError("again")

    run_with_retries(task, retries=1, checkpoint_dir=tmp_path)
    assert workspaces
    assert not any(w.exists() for w in workspaces)


def test_remote_paths_are_derived_beneath_the_run_output_path() -> None:
    paths = checkpoint_paths_for_run("s3://bucket/runs/r1", "abc123")
    assert paths == CheckpointPaths(
        prev_checkpoint_path="s3://bucket/runs/r1/rd/abc123/prev_checkpoint",
        checkpoint_path="s3://bucket/runs/r1/rd/abc123/checkpoint",
    )


def test_remote_paths_get_a_fresh_random_id_by_default() -> None:
    first = checkpoint_paths_for_run("s3://bucket/out/")
    second = checkpoint_paths_for_run("s3://bucket/out/")
    assert first.checkpoint_path != second.checkpoint_path
    assert first.checkpoint_path is not None
    assert first.checkpoint_path.startswith("s3://bucket/out/rd/")


def test_the_run_output_path_comes_from_run_base_dir() -> None:
    assert run_output_path("r1", run_base_dir="gs://b/runs/") == "gs://b/runs/r1"


def test_the_run_output_path_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYTE_CHECKPOINT_RUN_BASE_DIR", "s3://b/base")
    assert run_output_path("r2") == "s3://b/base/r2"


def test_a_missing_run_base_dir_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYTE_CHECKPOINT_RUN_BASE_DIR", raising=False)
    with pytest.raises(ConfigurationError, match="run_base_dir"):
        run_output_path("r1")


def add_from_checkpoint(increment: int) -> int:
    checkpoint = current_checkpoint()
    restored = checkpoint.load_sync()
    value = int(restored.read_bytes()) if restored else 0
    checkpoint.save_sync(str(value + increment).encode())
    return value + increment


async def add_from_checkpoint_async(increment: int) -> int:
    return await asyncio.to_thread(add_from_checkpoint, increment)


@pytest.mark.parametrize("task", [add_from_checkpoint, add_from_checkpoint_async])
def test_load_and_run_task_runs_one_attempt_with_the_given_paths(tmp_path: Path, task: object) -> None:
    (tmp_path / "prev").write_bytes(b"40")
    paths = CheckpointPaths(
        checkpoint_path=str(tmp_path / "cur"), prev_checkpoint_path=str(tmp_path / "prev")
    )
    assert load_and_run_task(task, checkpoint_paths=paths, inputs={"increment": 2}) == 42  # type: ignore[arg-type]
    assert (tmp_path / "cur").read_bytes() == b"42"


def test_load_and_run_task_resolves_module_function_references(tmp_path: Path) -> None:
    paths = CheckpointPaths(checkpoint_path=str(tmp_path / "cur"))
    result = load_and_run_task(
        "tests.runners.test_runners:add_from_checkpoint", checkpoint_paths=paths, inputs={"increment": 5}
    )
    assert result == 5


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("no_colon", "package.module:function"),
        ("no.such.module:f", "cannot import"),
        ("os:nope", "no attribute"),
    ],
)
def test_bad_task_references_are_clear_errors(reference: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_and_run_task(reference, checkpoint_paths=None)


# -- staging the previous checkpoint is part of the retry it serves ---------------------------------


@pytest.fixture
def s3_remote(s3_server: StorageServer) -> Remote:
    return remote_for("s3", s3_server)


@pytest.fixture
def s3_proxy(s3_remote: Remote) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", s3_remote.server.port)) as running:
        yield running


class _OnRetryLogged(logging.Handler):
    """Calls ``action`` when the runner logs that attempt ``attempt`` failed and a retry follows."""

    def __init__(self, attempt: int, action: object) -> None:
        super().__init__(logging.WARNING)
        self.prefix = f"attempt {attempt} failed"
        self.action = action

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.action()  # type: ignore[operator]


def test_a_store_that_stays_down_while_staging_uses_up_every_retry(
    s3_remote: Remote, s3_proxy: FaultProxy
) -> None:
    calls = 0

    def task() -> None:
        nonlocal calls
        calls += 1
        current_checkpoint().save_sync(b"state")
        s3_proxy.add_fault(status(503), times=None)  # the store goes down and stays down
        raise RuntimeError("the task failed")

    with pytest.raises(CheckpointUnavailableError) as caught:
        run_with_retries(
            task,
            retries=2,
            checkpoint_dir=s3_remote.uri("run"),
            storage_options=options_through(s3_remote, s3_proxy),
        )
    assert calls == 1  # the retries could not stage, so the task never ran again
    assert "attempt 2 failed; no retries left" in "".join(traceback.format_exception(caught.value))
    chain = []
    error: BaseException | None = caught.value
    while error is not None:
        chain.append(error)
        error = error.__context__
    assert isinstance(chain[-1], RuntimeError)
    assert str(chain[-1]) == "the task failed"
    notes = [note for error in chain for note in getattr(error, "__notes__", []) if "failed" in note]
    assert [note.removeprefix("flyte_checkpoint: ") for note in notes] == [
        "attempt 2 failed; no retries left (retries=2)",
        "attempt 1 failed; retrying as attempt 2 (retry 2 of 2)",
        "attempt 0 failed; retrying as attempt 1 (retry 1 of 2)",
    ]


def test_a_retry_whose_staging_failed_is_followed_by_one_that_resumes(
    s3_remote: Remote, s3_proxy: FaultProxy
) -> None:
    """The store is down for attempt 1's staging and back for attempt 2's: attempt 2 resumes."""
    restored_values: list[bytes | None] = []

    def task() -> str:
        checkpoint = current_checkpoint()
        restored = checkpoint.load_sync()
        restored_values.append(None if restored is None else restored.read_bytes())
        if restored is None:
            checkpoint.save_sync(b"from attempt 0")
            s3_proxy.add_fault(status(503), times=None)
            raise RuntimeError("the task failed")
        return "resumed"

    back_up = _OnRetryLogged(1, s3_proxy.clear_faults)
    logging.getLogger("flyte_checkpoint").addHandler(back_up)
    try:
        result = run_with_retries(
            task,
            retries=2,
            checkpoint_dir=s3_remote.uri("run"),
            storage_options=options_through(s3_remote, s3_proxy),
        )
    finally:
        logging.getLogger("flyte_checkpoint").removeHandler(back_up)
    assert result == "resumed"
    assert restored_values == [None, b"from attempt 0"]


# -- the async runner never blocks its event loop --------------------------------------------------


async def _longest_gap_while(work: asyncio.Future[object] | asyncio.Task[object]) -> float:
    """The longest pause between the ticks of a 1 ms ticker running until ``work`` is done."""
    longest = 0.0
    last = time.perf_counter()
    while not work.done():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        longest = max(longest, now - last)
        last = now
    return longest


async def test_closing_an_attempt_that_left_a_background_save_does_not_block_the_event_loop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.bin"
    state.write_bytes(os.urandom(8 << 20))
    returned_at: list[float] = []

    def slow_storage(done: int, total: int | None) -> None:
        time.sleep(0.03)  # about once per MiB: the save takes a while, as on a slow link

    async def task() -> str:
        await current_checkpoint().save(state, background=True, progress=slow_storage)
        returned_at.append(time.perf_counter())
        return "done"  # the attempt's helper still has the save to finish when it is closed

    run = asyncio.ensure_future(run_with_retries_async(task, retries=0, checkpoint_dir=tmp_path / "cp"))
    longest_gap = await _longest_gap_while(run)
    assert await run == "done"
    flush = time.perf_counter() - returned_at[0]  # the baseline: how long closing waited for the save
    assert (tmp_path / "cp" / "checkpoint").read_bytes() == state.read_bytes()
    assert longest_gap < flush / 4, f"the loop stalled {longest_gap:.3f} s of a {flush:.3f} s flush"


# -- types ------------------------------------------------------------------------------------------


def test_the_runners_return_the_task_result_type(tmp_path: Path) -> None:
    """Checked by mypy (assert_type); at run time the values are checked as well."""

    def sync_task(value: int) -> int:
        return value

    async def async_task(value: str) -> str:
        return value

    number = run_with_retries(sync_task, 1, retries=0, checkpoint_dir=tmp_path / "s")
    text = run_with_retries(async_task, "a", retries=0, checkpoint_dir=tmp_path / "a")
    assert (assert_type(number, int), assert_type(text, str)) == (1, "a")

    async def in_a_loop() -> tuple[int, str]:
        number = await run_with_retries_async(sync_task, 2, retries=0, checkpoint_dir=tmp_path / "t")
        text = await run_with_retries_async(async_task, "b", retries=0, checkpoint_dir=tmp_path / "u")
        return assert_type(number, int), assert_type(text, str)

    assert asyncio.run(in_a_loop()) == (2, "b")


def test_load_and_run_task_gives_the_task_the_attempt_number_passed(tmp_path: Path) -> None:
    def attempt() -> int:
        context = ctx()
        assert context is not None
        return context.attempt_number

    paths = CheckpointPaths(checkpoint_path=str(tmp_path / "cur"))
    assert load_and_run_task(attempt, checkpoint_paths=paths, attempt_number=3) == 3


def test_load_and_run_task_reads_the_attempt_number_from_the_environment_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def attempt() -> int:
        context = ctx()
        assert context is not None
        return context.attempt_number

    monkeypatch.setenv("FLYTE_ATTEMPT_NUMBER", "2")
    paths = CheckpointPaths(checkpoint_path=str(tmp_path / "cur"))
    assert load_and_run_task(attempt, checkpoint_paths=paths) == 2


def test_a_misspelt_storage_option_fails_the_run_before_its_first_attempt(temp_root: Path) -> None:
    calls: list[int] = []
    with pytest.raises(ConfigurationError, match="did you mean 'max_concurrency'"):
        run_with_retries(lambda: calls.append(1), retries=3, storage_options={"max_concurency": 4})
    assert calls == []
    assert _run_directories(temp_root) == []


async def test_transfer_settings_given_as_a_dict_fail_an_async_run_before_its_first_attempt(
    tmp_path: Path,
) -> None:
    calls: list[int] = []
    with pytest.raises(ConfigurationError, match=r"write transfer=TransferSettings\(fsync=True\)"):
        await run_with_retries_async(  # type: ignore[call-overload]
            lambda: calls.append(1),
            retries=3,
            checkpoint_dir=tmp_path,
            transfer={"fsync": True},
        )
    assert calls == []


def test_transfer_settings_reach_the_helper_of_every_attempt(tmp_path: Path) -> None:
    durable: list[bool] = []

    def task() -> None:
        checkpoint = current_checkpoint()
        durable.append(getattr(checkpoint._dest_backend, "fsync"))  # noqa: B009 - a LocalBackend's
        checkpoint.save_sync(b"x")
        if len(durable) == 1:
            raise RuntimeError("planned failure")

    run_with_retries(task, retries=1, checkpoint_dir=tmp_path, transfer=TransferSettings(fsync=True))
    assert durable == [True, True]
