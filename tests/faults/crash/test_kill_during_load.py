"""A load SIGKILLed at any point never passes for a restore, and the next load on a fresh helper works.

Method. A good checkpoint is saved (a file, stored as a raw payload object, or a directory,
stored as a ``.tar.gz``). A worker (``tests.faults.crash.workers load``, forked in its own session by
the zygote of ``harness.py``, its ``TMPDIR`` inside the test's directory) loads it and says
``restored DIGEST PATH`` only after ``load_sync`` returned, with the digest of what ``PATH``
then holds. A few uninterrupted loads
come first; on the narration of the last one, kill points are planned uniformly over 1.2x its
duration, each expressed from the last progress line before it (see ``harness.plan_kills``),
plus one right after ``restored``. After every kill:

* if the worker said ``restored``, what it restored was exactly the saved checkpoint;
* a fresh :class:`Checkpoint` in this process loads the checkpoint exactly (so the killed load
  neither damaged nor locked the stored object);
* the killed worker's workspace (which a SIGKILL leaves behind in its ``TMPDIR``) holds no
  ``payload`` file unless it is complete: a payload is written under a temporary name and
  renamed, so task code never finds half of one. A directory restore killed midway leaves a
  partial tree there, which nothing reports as restored; it is counted in the summary.

Sizes: a 20 MiB file and a ~24 MiB directory locally (25 kills each) and a 20 MiB file on S3
(10 kills); ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` uses 256 MiB locally and 64 MiB on S3.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.single.workspace import WORKSPACE_PREFIX
from tests.faults.crash.harness import (
    PRELOAD,
    SPREAD,
    Event,
    KillPoint,
    MiB,
    OnceEach,
    TrialLog,
    Worker,
    Zygote,
    observe,
    plan_kills,
    record,
    series_size,
    write_model_tree,
    write_random_file,
)
from tests.faults.crash.workers import content_digest
from tests.storage_servers import StorageServer, create_bucket

LOCAL_KILLS = 25
S3_KILLS = 10
REFERENCE_LOADS = 3
"""Uninterrupted loads first; the kill points are planned on the narration of the last one."""


SERIES = [("local", "file"), ("local", "dir"), ("s3", "file")]
FILE_SERIES = [pair for pair in SERIES if pair[1] == "file"]


@dataclass(frozen=True)
class Trial:
    """One killed load and what was found after it."""

    point: KillPoint | None
    """Where the kill was aimed; ``None``: right after the worker said ``restored``."""
    phase: str
    exit_status: int
    reported: str | None
    """The digest the worker said it restored, if it got that far."""
    fresh_load: str
    """What a fresh helper loaded afterwards: ``saved`` or a description of what went wrong."""
    payload_files: tuple[str, ...]
    """Digests of ``payload`` files found in the killed worker's leftover workspaces."""
    leftover_workspaces: int


@dataclass
class Series:
    backend: str
    kind: str
    expected: str
    trials: list[Trial] = field(default_factory=list)


def _phase(worker: Worker) -> str:
    if worker.seen("restored"):
        return "after restore"
    if worker.progress_seen() < 0:
        return "before any progress"
    return "mid-read"


def _leftovers(tmp: Path) -> tuple[int, tuple[str, ...]]:
    """How many workspaces a killed worker left in ``tmp``, and digests of their payload files."""
    workspaces = sorted(path for path in tmp.glob(f"{WORKSPACE_PREFIX}*") if path.is_dir())
    payloads = tuple(content_digest(path / "payload") for path in workspaces if (path / "payload").exists())
    for path in workspaces:
        shutil.rmtree(path)
    for lock in tmp.glob(f"{WORKSPACE_PREFIX}*.lock"):  # what the next workspace would sweep
        lock.unlink()
    return len(workspaces), payloads


def _run_series(
    backend: str, kind: str, root: Path, src: str, options: dict[str, Any] | None, size: int, kills: int
) -> Series:
    started_at = time.monotonic()
    if kind == "dir":
        source = write_model_tree(root / "data", size, 1)
    else:
        source = write_random_file(root / "data.bin", size, 1)
    with Checkpoint(src, storage_options=options) as saver:
        saver.save_sync(source)
    expected = content_digest(source)
    tmp = root / "tmp"
    tmp.mkdir()
    series = Series(backend, kind, expected)
    durations: list[float] = []
    reference: list[Event] = []
    with Zygote(root / "logs", preload=PRELOAD[backend]) as zygote:

        def spawn() -> Worker:
            return zygote.spawn(["load", "--src", src], storage_options=options, env={"TMPDIR": str(tmp)})

        for _ in range(REFERENCE_LOADS):
            with spawn() as worker:
                assert worker.finish() == 0, f"an uninterrupted load failed: {worker.describe()}"
                assert worker.first("restored").words[0] == expected, worker.describe()
                durations.append(worker.first("restored").at - worker.first("started").at)
                reference = worker.events
            _leftovers(tmp)
        points: list[KillPoint | None] = [*plan_kills(reference, "restored", kills, SPREAD), None]
        for point in points:
            with spawn() as worker:
                if point is None:
                    worker.wait_for("restored")
                else:
                    worker.run_to(point)
                status = worker.kill()
            found = observe(src, options, {"saved": expected})
            workspaces, payloads = _leftovers(tmp)
            series.trials.append(
                Trial(
                    point=point,
                    phase=_phase(worker),
                    exit_status=status,
                    reported=worker.first("restored").words[0] if worker.seen("restored") else None,
                    fresh_load=found,
                    payload_files=payloads,
                    leftover_workspaces=workspaces,
                )
            )

    log = TrialLog(f"kill during load, {backend}, {kind} ({size // MiB} MiB)")
    for trial in series.trials:
        log.outcomes["fresh load exact" if trial.fresh_load == "saved" else trial.fresh_load] += 1
        log.phases[trial.phase] += 1
    reported = sum(trial.reported is not None for trial in series.trials)
    log.notes.append(f"{reported} said restored, all checked")
    log.notes.append(
        f"{sum(trial.leftover_workspaces for trial in series.trials)} workspaces left behind by kills"
    )
    log.notes.append(f"one load {1000 * min(durations[1:]):.0f}-{1000 * max(durations[1:]):.0f} ms")
    log.seconds = time.monotonic() - started_at
    record(log)
    return series


@pytest.fixture(scope="session")
def load_series(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Series]:
    """Runs the series of one (backend, kind) the first time a test asks for it."""
    cache: OnceEach[Series] = OnceEach()

    def get(backend: str, kind: str) -> Series:
        def run() -> Series:
            root = tmp_path_factory.mktemp(f"kill-load-{backend}-{kind}")
            size = series_size(backend, kind)
            if backend == "local":
                src = str(root / "store" / "checkpoint")
                return _run_series(backend, kind, root, src, None, size, LOCAL_KILLS)
            server: StorageServer = request.getfixturevalue("s3_server")
            src = f"s3://{create_bucket(server, f'load-{kind}')}/attempt/checkpoint"
            return _run_series(backend, kind, root, src, server.storage_options, size, S3_KILLS)

        return cache.get((backend, kind), run)

    return get


def _show(trials: list[Trial]) -> str:
    return "\n".join(repr(trial) for trial in trials[:5])


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_a_load_worker_says_restored_only_with_the_complete_checkpoint_in_place(
    load_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = load_series(backend, kind)
    wrong = [trial for trial in series.trials if trial.reported not in (None, series.expected)]
    assert not wrong, _show(wrong)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_a_fresh_helper_loads_the_checkpoint_exactly_after_every_killed_load(
    load_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = load_series(backend, kind)
    wrong = [trial for trial in series.trials if trial.fresh_load != "saved"]
    assert not wrong, _show(wrong)


@pytest.mark.parametrize(("backend", "kind"), FILE_SERIES)
def test_a_killed_load_never_leaves_an_incomplete_payload_file(
    load_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = load_series(backend, kind)
    wrong = [trial for trial in series.trials if set(trial.payload_files) - {series.expected}]
    assert not wrong, _show(wrong)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_every_load_worker_ran_until_it_was_killed_or_had_restored(
    load_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = load_series(backend, kind)
    failed = [trial for trial in series.trials if trial.exit_status not in (-9, 0)]
    failed += [trial for trial in series.trials if trial.exit_status == 0 and trial.reported is None]
    assert not failed, _show(failed)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_the_load_kills_landed_both_before_and_after_the_restore(
    load_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = load_series(backend, kind)
    kills = LOCAL_KILLS if backend == "local" else S3_KILLS
    assert len(series.trials) == kills + 1
    phases = {trial.phase for trial in series.trials}
    assert "after restore" in phases
    assert phases - {"after restore"}
