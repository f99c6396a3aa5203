"""A save SIGKILLed at any point leaves the old checkpoint or the new one, never a partial one.

Method. For each backend (local disk, a real S3 server) and data kind (bytes, a file, a
directory) a series runs against one destination that already holds a good checkpoint:

1. Four uninterrupted saves (versions A, B, A, B) by worker processes; the last of each version
   is the reference run: its narration (``started``, a ``progress`` line per MiB, ``committed``)
   is the timeline on which the kill points are planned.
2. Then a worker (``tests.faults.crash.workers save``, forked in its own session by the zygote of
   ``harness.py``, which has done the imports once) saves the *other* version over the current
   one and is SIGKILLed at the next kill point. The points are spread uniformly over 1.2x the
   reference duration, and each is expressed from the last milestone before it ("0.8 ms after
   reporting 12 MiB written"), so it lands at the same place in the work however fast the disk
   is that moment: before the first write, mid-write, during the commit (flush, fsync, rename,
   directory fsync) and after it. One more trial kills right after the worker says
   ``committed``. A bytes save reports progress once, when everything is written, so its points
   before that are plain delays after ``started``.
3. After every kill a fresh :class:`Checkpoint` in this process loads the destination: it must
   return exactly the old or exactly the new version (digest of the bytes, or of the whole tree
   with names, links and contents), never raise, never return ``None``. A trial whose worker
   said ``committed`` must give the new version. Local temp files are listed before and after:
   a save that got as far as writing has removed every earlier trial's temp file, and a killed
   save leaves at most its own. On S3 no object other than the checkpoint may ever be visible;
   the incomplete multipart uploads a kill leaves behind are counted (they are invisible); the
   saves run with ``stale_upload_age=0``, so each save aborts the ones earlier kills left.
4. A last uninterrupted save must leave no temp file and load back, and no incomplete upload:
   its stale-upload sweep aborted every one the kills left.

A SIGKILLed S3 client's last request (the part upload or the CompleteMultipartUpload it had
sent) may still be applied by the server after the client died, so the load right after a kill
can overlap the object being replaced. Its GET, pinned to the ETag it read first, is then
refused (412), or the digest check notices the replacement: transient errors the load retries
(tested deterministically in ``test_concurrent_saves.py``). Should a load still fail that way it
is counted ("raced" in the summary) and repeated once the server has settled, so these tests
judge what was stored.

The series of each (backend, kind) runs once per session and several tests read its record, one
behaviour each. The terminal summary ("crash consistency") lists trials, outcomes (old / new)
and where the kills landed.

Sizes: by default bytes and file are 20 MiB and the directory about 24 MiB, with 50 timed kills
per kind on local disk and 25 per kind on S3 (20 MiB, above the 8 MiB multipart part), so the
whole of ``tests/faults/crash`` takes about a minute on two cores. ``FLYTE_CHECKPOINT_SLOW_TESTS=1``
uses 256 MiB locally (the issue's size) and 64 MiB on S3.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

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
    local_temp_files,
    observe,
    plan_kills,
    record,
    series_size,
    write_model_tree,
    write_random_file,
)
from tests.faults.crash.workers import content_digest
from tests.storage_servers import StorageServer, create_bucket

LOCAL_KILLS = 50
S3_KILLS = 25
REFERENCE_SAVES = ("A", "B", "A", "B")
"""Uninterrupted saves before the kills; the last one of each version is the reference run
whose narration the kill points are planned on."""

RACE_MARKS = ("pre-conditions you specified did not hold", "replaced while it was being read")
"""In the errors of a load whose object was replaced after it read its ETag (S3's 412), or
while it read the body."""
SETTLE_SECONDS = 0.5


SERIES = [
    ("local", "bytes"),
    ("local", "file"),
    ("local", "dir"),
    ("s3", "bytes"),
    ("s3", "file"),
]
LOCAL_SERIES = [pair for pair in SERIES if pair[0] == "local"]
S3_SERIES = [pair for pair in SERIES if pair[0] == "s3"]


@dataclass(frozen=True)
class Version:
    """One of the two contents saved alternately: its source path and content digest."""

    name: str
    source: Path
    digest: str


@dataclass(frozen=True)
class Trial:
    """One killed save and what was found after it."""

    point: KillPoint | None
    """Where the kill was aimed; ``None``: right after the worker said ``committed``."""
    phase: str
    committed: bool
    wrote: bool
    """Whether the worker reported progress, i.e. got past opening its writer."""
    exit_status: int
    outcome: str
    """``old``, ``new``, or a description of what the load gave instead."""
    leftovers_before: frozenset[str]
    leftovers_after: frozenset[str]
    """Local: ``.fc-tmp`` files beside the object. S3: visible objects other than the checkpoint."""
    dangling_uploads: int
    raced: bool
    """Whether the first load raced the server applying the dead worker's last request."""


@dataclass
class Series:
    """Every trial of one (backend, kind), plus the final uninterrupted save."""

    backend: str
    kind: str
    trials: list[Trial] = field(default_factory=list)
    final_outcome: str = ""
    final_expected: str = ""
    final_leftovers: frozenset[str] = frozenset()
    final_dangling_uploads: int = 0
    log: TrialLog | None = None


@dataclass(frozen=True)
class Place:
    """Where a series saves, and how to look around it."""

    dest: str
    storage_options: dict[str, Any] | None
    leftovers: Callable[[], frozenset[str]]
    dangling_uploads: Callable[[], int]


def _versions(kind: str, root: Path, size: int) -> dict[str, Version]:
    versions = {}
    for seed, name in enumerate(("A", "B"), start=1):
        if kind == "dir":
            source = write_model_tree(root / name, size, seed)
        else:
            source = write_random_file(root / f"{name}.bin", size + (seed - 1) * MiB, seed)
        versions[name] = Version(name, source, content_digest(source))
    return versions


def _local_place(root: Path) -> Place:
    dest = str(root / "store" / "checkpoint")

    def dangling_uploads() -> int:
        return 0

    return Place(dest, None, lambda: local_temp_files(dest), dangling_uploads)


def _s3_place(server: StorageServer, kind: str) -> Place:
    bucket = create_bucket(server, f"crash-{kind}")
    prefix = f"{bucket}/attempt"
    dest = f"s3://{prefix}/checkpoint"
    fs = server.filesystem()

    def leftovers() -> frozenset[str]:
        fs.invalidate_cache()
        return frozenset(path for path in fs.find(prefix) if path != f"{prefix}/checkpoint")

    def dangling_uploads() -> int:
        # Counted, not cleared: the next save aborts them (stale_upload_age 0, below).
        return len(fs.list_multipart_uploads(bucket))

    # Every earlier incomplete upload to the key is stale at once: each save sweeps the ones
    # the kills before it left, which keeps the emulator's memory flat.
    options = {**server.storage_options, "stale_upload_age": 0}
    if kind == "file":
        # A file's save reports progress as the store acknowledges its parts; with its 32
        # parts in flight they all land together at the end on moto, leaving the kill plan no
        # milestones mid-upload. One 5 MiB part at a time spreads them over the save.
        options |= {"file_concurrency": 1, "part_size": 5 * MiB}
    return Place(dest, options, leftovers, dangling_uploads)


def _phase(worker: Worker, total: int) -> str:
    if worker.seen("committed"):
        return "after commit"
    done = worker.progress_seen()
    if done < 0:
        return "before any progress"
    if done >= total:
        return "all written, not yet committed"
    return "mid-write"


def _run_series(backend: str, kind: str, root: Path, place: Place, size: int, kills: int) -> Series:
    started_at = time.monotonic()
    versions = _versions(kind, root / "data", size)
    digests = {name: version.digest for name, version in versions.items()}
    env = {"TMPDIR": str(root / "tmp")}
    (root / "tmp").mkdir()
    series = Series(backend, kind)
    durations: list[float] = []
    totals: dict[str, int] = {}
    references: dict[str, list[Event]] = {}
    with Zygote(root / "logs", preload=PRELOAD[backend]) as zygote:

        def spawn(name: str) -> Worker:
            argv = ["save", "--kind", kind, "--source", str(versions[name].source), "--dest", place.dest]
            return zygote.spawn(argv, storage_options=place.storage_options, env=env)

        def save_uninterrupted(name: str) -> None:
            with spawn(name) as worker:
                status = worker.finish()
                assert status == 0, f"an uninterrupted save failed: {worker.describe()}"
                durations.append(worker.first("committed").at - worker.first("started").at)
                totals[name] = worker.progress_seen()
                references[name] = worker.events
            found = observe(place.dest, place.storage_options, digests)
            assert found == name, f"an uninterrupted save of {name} loaded back as {found}"

        for name in REFERENCE_SAVES:
            save_uninterrupted(name)
        plans = {name: plan_kills(events, "committed", kills, SPREAD) for name, events in references.items()}
        current = REFERENCE_SAVES[-1]
        for number in range(kills + 1):
            target = "A" if current == "B" else "B"
            point = plans[target][number] if number < kills else None
            before = place.leftovers()
            with spawn(target) as worker:
                if point is None:
                    worker.wait_for("committed")
                else:
                    worker.run_to(point)
                status = worker.kill()
            found = observe(place.dest, place.storage_options, digests)
            raced = any(mark in found for mark in RACE_MARKS)
            if raced:
                # The server was still applying the dead worker's last request (see the module
                # docstring); load again once it has.
                time.sleep(SETTLE_SECONDS)
                found = observe(place.dest, place.storage_options, digests)
            series.trials.append(
                Trial(
                    point=point,
                    phase=_phase(worker, totals[target]),
                    committed=worker.seen("committed"),
                    wrote=worker.progress_seen() >= 0,
                    exit_status=status,
                    outcome={current: "old", target: "new"}.get(found, found),
                    leftovers_before=before,
                    leftovers_after=place.leftovers(),
                    dangling_uploads=place.dangling_uploads(),
                    raced=raced,
                )
            )
            if found in versions:
                current = found

        series.final_expected = "A" if current == "B" else "B"
        with spawn(series.final_expected) as worker:
            assert worker.finish() == 0, f"the final save failed: {worker.describe()}"
    series.final_outcome = observe(place.dest, place.storage_options, digests)
    series.final_leftovers = place.leftovers()
    series.final_dangling_uploads = place.dangling_uploads()

    log = TrialLog(f"kill during save, {backend}, {kind} ({size // MiB} MiB)")
    for trial in series.trials:
        log.outcomes[trial.outcome] += 1
        log.phases[trial.phase] += 1
    spread = sorted(durations[1:])
    log.notes.append(f"one save {1000 * spread[0]:.0f}-{1000 * spread[-1]:.0f} ms")
    if backend == "s3":
        dangling = sum(trial.dangling_uploads for trial in series.trials)
        log.notes.append(
            f"{dangling} incomplete multipart uploads seen after kills (swept by the next save), "
            f"{series.final_dangling_uploads} after the final save"
        )
        races = sum(trial.raced for trial in series.trials)
        log.notes.append(f"{races} loads raced the server finishing a dead worker's upload and raised")
    log.seconds = time.monotonic() - started_at
    series.log = record(log)
    return series


@pytest.fixture(scope="session")
def kill_series(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Series]:
    """Runs the series of one (backend, kind) the first time a test asks for it."""
    cache: OnceEach[Series] = OnceEach()

    def get(backend: str, kind: str) -> Series:
        def run() -> Series:
            root = tmp_path_factory.mktemp(f"kill-save-{backend}-{kind}")
            size = series_size(backend, kind)
            if backend == "local":
                return _run_series(backend, kind, root, _local_place(root), size, LOCAL_KILLS)
            server: StorageServer = request.getfixturevalue("s3_server")
            return _run_series(backend, kind, root, _s3_place(server, kind), size, S3_KILLS)

        return cache.get((backend, kind), run)

    return get


def _show(trials: list[Trial]) -> str:
    return "\n".join(repr(trial) for trial in trials[:5])


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_every_load_after_a_killed_save_returns_exactly_the_old_or_the_new_checkpoint(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    wrong = [trial for trial in series.trials if trial.outcome not in ("old", "new")]
    assert not wrong, f"{len(wrong)} of {len(series.trials)} loads were neither:\n{_show(wrong)}"


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_every_killed_worker_was_running_until_the_kill_or_had_saved(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    failed = [trial for trial in series.trials if trial.exit_status not in (-9, 0)]
    failed += [trial for trial in series.trials if trial.exit_status == 0 and not trial.committed]
    assert not failed, _show(failed)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_a_save_killed_after_it_said_committed_loads_as_the_new_checkpoint(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    committed = [trial for trial in kill_series(backend, kind).trials if trial.committed]
    assert committed, "no trial was killed after its commit"
    assert all(trial.outcome == "new" for trial in committed), _show(committed)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_the_kills_landed_both_before_and_after_the_commit(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    kills = LOCAL_KILLS if backend == "local" else S3_KILLS
    outcomes = {trial.outcome for trial in series.trials}
    assert len(series.trials) == kills + 1
    assert {"old", "new"} <= outcomes


@pytest.mark.parametrize(("backend", "kind"), [pair for pair in SERIES if pair[1] != "bytes"])
def test_some_kills_landed_in_the_middle_of_writing(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    phases = {trial.phase for trial in kill_series(backend, kind).trials}
    assert "mid-write" in phases


@pytest.mark.parametrize(("backend", "kind"), LOCAL_SERIES)
def test_a_save_that_started_writing_removed_the_temp_files_of_earlier_killed_saves(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    kept = [
        trial for trial in series.trials if trial.wrote and trial.leftovers_before & trial.leftovers_after
    ]
    assert not kept, _show(kept)


@pytest.mark.parametrize(("backend", "kind"), LOCAL_SERIES)
def test_a_killed_local_save_leaves_at_most_its_own_temp_file(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    extra = [trial for trial in series.trials if len(trial.leftovers_after - trial.leftovers_before) > 1]
    extra += [trial for trial in series.trials if trial.committed and trial.leftovers_after]
    assert not extra, _show(extra)


@pytest.mark.parametrize(("backend", "kind"), S3_SERIES)
def test_a_killed_s3_save_never_leaves_a_visible_object_besides_the_checkpoint(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    stray = [trial for trial in series.trials if trial.leftovers_after]
    assert not stray, _show(stray)


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_an_uninterrupted_save_after_the_kills_loads_back_and_leaves_nothing_behind(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    assert series.final_outcome == series.final_expected
    assert series.final_leftovers == frozenset()


@pytest.mark.parametrize(("backend", "kind"), S3_SERIES)
def test_the_save_after_the_kills_aborted_every_upload_they_left(
    kill_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    series = kill_series(backend, kind)
    assert sum(trial.dangling_uploads for trial in series.trials) > 0, "no kill left an upload to sweep"
    assert series.final_dangling_uploads == 0
