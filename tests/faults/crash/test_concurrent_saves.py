"""Two processes saving to one destination at once leave one of the two complete objects.

Method. Each round forks two save workers (``tests.faults.crash.workers save``, from the zygote of
``harness.py``), one saving version A and one version B, both told to start at the same moment
(``--start-at``), so the saves overlap (the summary counts the rounds whose
``started``..``committed`` intervals, in the children's own clock, really overlapped). Both
must succeed; the destination must then load as exactly A or exactly B, with no temp file
(local) or stray object (S3) left.

Also here: a load while another writer replaces the object must give back one complete
version. Locally the reader keeps the old file open. On S3 the load is one streamed GET, which
the store serves from one version; a GET sent after the object was replaced is refused (it is
pinned to the ETag the load read first), a transient error, so the bounded retry loads the new
complete object.

Sizes: 20 MiB (bytes, file) and ~24 MiB (directory) locally, 8 rounds each; 20 MiB file on S3,
4 rounds. ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` uses 256 MiB locally and 64 MiB on S3.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from tests.faults.crash.harness import (
    PRELOAD,
    MiB,
    OnceEach,
    TrialLog,
    Zygote,
    local_temp_files,
    observe,
    reaping,
    record,
    series_size,
    write_model_tree,
    write_random_file,
)
from tests.faults.crash.workers import content_digest
from tests.storage_servers import StorageServer, create_bucket

LOCAL_ROUNDS = 8
S3_ROUNDS = 4

START_DELAY = 0.3
"""Seconds from forking a round's two workers to the moment both start saving."""

SERIES = [("local", "bytes"), ("local", "file"), ("local", "dir"), ("s3", "file")]


@dataclass(frozen=True)
class Round:
    """Two saves at once and what the destination held afterwards."""

    exit_statuses: tuple[int, int]
    overlapped: bool
    outcome: str
    leftovers: frozenset[str]


@dataclass
class Series:
    backend: str
    kind: str
    rounds: list[Round] = field(default_factory=list)


def _run_series(
    backend: str,
    kind: str,
    root: Path,
    dest: str,
    options: dict[str, Any] | None,
    leftovers: Callable[[], frozenset[str]],
    size: int,
    rounds: int,
) -> Series:
    started_at = time.monotonic()
    sources = {}
    for seed, name in enumerate(("A", "B"), start=1):
        if kind == "dir":
            sources[name] = write_model_tree(root / "data" / name, size, seed)
        else:
            sources[name] = write_random_file(root / "data" / f"{name}.bin", size + seed * 4096, seed)
    digests = {name: content_digest(source) for name, source in sources.items()}
    env = {"TMPDIR": str(root / "tmp")}
    (root / "tmp").mkdir()
    series = Series(backend, kind)
    with Zygote(root / "logs", preload=PRELOAD[backend]) as zygote:
        for number in range(rounds):
            order = ("A", "B") if number % 2 == 0 else ("B", "A")
            start_at = time.monotonic() + START_DELAY
            with reaping([]) as workers:
                for name in order:
                    argv = ["save", "--kind", kind, "--source", str(sources[name]), "--dest", dest]
                    argv += ["--start-at", repr(start_at)]
                    workers.append(zygote.spawn(argv, storage_options=options, env=env))
                statuses = (workers[0].finish(), workers[1].finish())
                spans = [  # the children's own clock: the parent reads one pipe after the other
                    (float(worker.first("started").words[0]), float(worker.first("committed").words[0]))
                    for worker in workers
                    if worker.seen("started") and worker.seen("committed")
                ]
            overlapped = len(spans) == 2 and spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
            series.rounds.append(Round(statuses, overlapped, observe(dest, options, digests), leftovers()))
    log = TrialLog(f"two saves at once, {backend}, {kind} ({size // MiB} MiB)", phase_label="saves")
    for entry in series.rounds:
        log.outcomes[entry.outcome] += 1
        log.phases["overlapping" if entry.overlapped else "not overlapping"] += 1
    log.seconds = time.monotonic() - started_at
    record(log)
    return series


@pytest.fixture(scope="session")
def concurrent_series(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], Series]:
    """Runs the rounds of one (backend, kind) the first time a test asks for them."""
    cache: OnceEach[Series] = OnceEach()

    def get(backend: str, kind: str) -> Series:
        def run() -> Series:
            root = tmp_path_factory.mktemp(f"concurrent-{backend}-{kind}")
            size = series_size(backend, kind)
            if backend == "local":
                dest = str(root / "store" / "checkpoint")
                return _run_series(
                    backend, kind, root, dest, None, lambda: local_temp_files(dest), size, LOCAL_ROUNDS
                )
            server: StorageServer = request.getfixturevalue("s3_server")
            bucket = create_bucket(server, f"concurrent-{kind}")
            dest = f"s3://{bucket}/attempt/checkpoint"
            fs = server.filesystem()

            def stray() -> frozenset[str]:
                fs.invalidate_cache()
                return frozenset(set(fs.find(bucket)) - {f"{bucket}/attempt/checkpoint"})

            return _run_series(
                backend,
                kind,
                root,
                dest,
                server.storage_options,
                stray,
                size,
                S3_ROUNDS,
            )

        return cache.get((backend, kind), run)

    return get


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_two_saves_at_once_leave_exactly_one_of_the_two_objects(
    concurrent_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    rounds = concurrent_series(backend, kind).rounds
    assert all(entry.outcome in ("A", "B") for entry in rounds), rounds


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_both_of_two_saves_at_once_succeed(
    concurrent_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    rounds = concurrent_series(backend, kind).rounds
    assert all(entry.exit_statuses == (0, 0) for entry in rounds), rounds


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_two_saves_at_once_leave_nothing_beside_the_object(
    concurrent_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    rounds = concurrent_series(backend, kind).rounds
    assert all(entry.leftovers == frozenset() for entry in rounds), rounds


@pytest.mark.parametrize(("backend", "kind"), SERIES)
def test_the_two_saves_really_ran_at_the_same_time(
    concurrent_series: Callable[[str, str], Series], backend: str, kind: str
) -> None:
    rounds = concurrent_series(backend, kind).rounds
    assert any(entry.overlapped for entry in rounds), rounds


# -- a load racing a replacement --------------------------------------------------------------


@pytest.fixture(
    params=[
        "local",
        "s3",
    ]
)
def replaced_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any] | None]:
    """A destination (local or S3) and its storage options."""
    if request.param == "local":
        return str(tmp_path / "store" / "checkpoint"), None
    server: StorageServer = request.getfixturevalue("s3_server")
    return f"s3://{create_bucket(server, 'race')}/attempt/checkpoint", server.storage_options


def test_a_load_while_another_writer_replaces_the_object_returns_one_complete_version(
    replaced_store: tuple[str, dict[str, Any] | None],
) -> None:
    dest, options = replaced_store
    # Many reads long, so the replace (from the progress callback of the first) lands mid-load.
    old, new = os.urandom(40 * MiB), os.urandom(40 * MiB)
    Checkpoint(dest, storage_options=options).save_sync(old)
    replaced: list[int] = []

    def replace_after_the_first_read(done: int, total: int | None) -> None:
        if not replaced:
            replaced.append(done)
            Checkpoint(dest, storage_options=options).save_sync(new)

    with Checkpoint("unused-destination", dest, storage_options=options, repair_prev_uri=False) as loader:
        restored = loader.load_sync(progress=replace_after_the_first_read)
        assert replaced, "the object was not replaced during the load"
        assert restored is not None
        assert restored.read_bytes() in (old, new)
