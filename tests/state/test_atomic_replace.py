"""Known limitation 3 of the spec: replacing a checkpoint must be atomic, on disk and on S3.

A saver process writing a new generation over a committed checkpoint reports every object it
makes visible (controller, each part, metadata.json, manifest.json, the pointer), and is SIGKILLed
right after each of them, and again half-way between them: before any write, between part writes,
after the manifest, right after the pointer (during garbage collection). After every kill the
directory must load, whole, either the old generation or the new one; never neither, never a mix.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import pytest

from flyte_checkpoint.state import load_checkpoint, save_checkpoint
from flyte_checkpoint.state.layout import MANIFEST_NAME, Layout
from flyte_checkpoint.state.pointer import read_pointer
from tests.state.conftest import SPAWN
from tests.state.workers import Controller, Unit, generation_unit, saver_fork_server
from tests.stores import Store

# At least 20 kill points on local disk and S3; fewer parts on the object stores, where every
# request goes to an emulator sharing the same two cores. Many parts make the save slow enough to
# be killed between part writes. GCS and Azure commit by the same single-object write as S3: one
# kill right after each of their objects is enough there, and keeps their share of the suite small.
TRIALS = {"local": 24, "s3": 20, "gcs": 10, "azure": 10}
PARTS = {"local": 16, "s3": 8, "gcs": 4, "azure": 4}
PART_SIZE = 64 << 10
_WAIT = 30.0


def objects_per_save(parts: int) -> int:
    """Controller, the parts, metadata.json, manifest.json and the pointer."""
    return parts + 4


class SaverServer:
    """The parent's side of :func:`saver_fork_server`."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def receive(self) -> tuple[str, Any]:
        if not self.conn.poll(_WAIT):
            raise AssertionError("the saver fork server did not answer")
        message: tuple[str, Any] = self.conn.recv()
        return message

    def save_and_kill(
        self, store: Store, checkpoint_dir: str, generation: int, after_writes: int | None, delay: float = 0.0
    ) -> list[float]:
        """Save ``generation`` in a fresh saver and SIGKILL it ``delay`` s after it reported its
        ``after_writes``-th visible object (0: as it starts; ``None``: once the save returned).
        Returns the times of its reports, from the start of the save."""
        self.conn.send((checkpoint_dir, store.storage_options, generation, PARTS[store.kind], PART_SIZE))
        kind, pid = self.receive()
        assert kind == "started"
        kind, started = self.receive()
        assert kind == "ready", f"the saver died before starting its save (status {started})"
        times = [started]
        awaited = "done" if after_writes is None else "wrote"
        seen = 0
        while (after_writes is None and seen == 0) or (after_writes is not None and seen < after_writes):
            kind, when = self.receive()
            assert kind != "exited", f"the saver died during its save (status {when})"
            times.append(when)
            seen += kind == awaited
        if delay:
            time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        while (message := self.receive())[0] != "exited":
            pass
        assert os.WIFSIGNALED(message[1]), "the saver must end by SIGKILL, not by itself"
        return [when - started for when in times]


@pytest.fixture
def saver_server() -> Iterator[SaverServer]:
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=saver_fork_server, args=(child,), name="saver-fork-server")
    process.start()
    child.close()
    try:
        yield SaverServer(parent)
    finally:
        with contextlib.suppress(OSError):
            parent.send(None)
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)
        parent.close()


@dataclass(frozen=True)
class Trial:
    point: str
    phase: str
    outcome: str


def loaded_generation(store: Store, checkpoint_dir: str) -> int:
    """The one generation the checkpoint holds; fails on a mix of generations."""
    controller, units = Controller(), [Unit() for _ in range(PARTS[store.kind])]
    metadata = load_checkpoint(
        checkpoint_dir, controller=controller, parts=units, storage_options=store.storage_options
    )
    generations: set[int] = {controller.step, metadata["generation"]}
    for position, unit in enumerate(units):
        generation, stored_position = unit.data[0]
        assert stored_position == position
        assert unit.data[1] == bytes([generation % 256]) * PART_SIZE
        generations.add(generation)
    assert len(generations) == 1, f"a mix of generations: {sorted(generations)}"
    (generation,) = generations
    return generation


def phase_at_kill(layout: Layout, committed_before: str, parts: int) -> str:
    """How far the killed save got, read from what it left behind."""
    pointer = read_pointer(layout)
    assert pointer is not None
    versions = layout.list_versions()
    if pointer.version_id != committed_before:
        if committed_before in versions:
            return "committed, old version not yet collected"
        return "committed and collected"
    new = [version for version in versions if version != committed_before]
    if not new:
        return "no new object yet"
    names = {uri.rsplit("/", 1)[-1] for uri in layout.backend.list_prefix(layout.version_uri(new[-1]))}
    if MANIFEST_NAME in names:
        return "manifest written, pointer not yet"
    stored = sum(name.startswith("part-") for name in names)
    return f"{stored:02d} of {parts} parts stored"


def run_kill_trials(store: Store, saver_server: SaverServer) -> list[Trial]:
    checkpoint_dir = store.uri("ckpt")
    layout = Layout.of(checkpoint_dir, store.storage_options)
    save_checkpoint(
        checkpoint_dir,
        controller=Controller({1}, step=1),
        parts=[generation_unit(1, position, PART_SIZE) for position in range(PARTS[store.kind])],
        metadata={"generation": 1},
        storage_options=store.storage_options,
    )
    generation = 1
    parts = PARTS[store.kind]
    events = objects_per_save(parts)
    # A complete save first: it measures the gaps between writes, for the half-way kills.
    reports = saver_server.save_and_kill(store, checkpoint_dir, generation + 1, None)
    generation = loaded_generation(store, checkpoint_dir)
    trials = [Trial("save returned", "after the save finished", "new")]
    half_gap = reports[-1] / (2 * len(reports))
    plan = [(writes, 0.0) for writes in range(events + 1)]
    halfway = TRIALS[store.kind] - len(trials) - len(plan)
    plan += [(round(index * (events - 1) / max(1, halfway - 1)), half_gap) for index in range(halfway)]
    for writes, delay in plan:
        pointer = read_pointer(layout)
        assert pointer is not None
        saver_server.save_and_kill(store, checkpoint_dir, generation + 1, writes, delay)
        phase = phase_at_kill(layout, pointer.version_id, parts)
        loaded = loaded_generation(store, checkpoint_dir)
        point = f"{'half-way after' if delay else 'right after'} object {writes} of {events}"
        assert loaded in (generation, generation + 1), f"neither old nor new after a kill {point}"
        if writes == events and not delay:
            assert loaded == generation + 1, "the pointer was written: the new generation must load"
        trials.append(Trial(point, phase, "old" if loaded == generation else "new"))
        generation = loaded
    # The next successful save removes what every killed save left behind.
    final = save_checkpoint(
        checkpoint_dir,
        controller=Controller({generation + 1}, step=generation + 1),
        parts=[generation_unit(generation + 1, position, PART_SIZE) for position in range(PARTS[store.kind])],
        metadata={"generation": generation + 1},
        storage_options=store.storage_options,
    )
    assert layout.list_versions() == [final.version_id]
    return trials


def report(store: Store, trials: list[Trial]) -> str:
    outcomes = collections.Counter(trial.outcome for trial in trials)
    phases = collections.Counter(trial.phase for trial in trials)
    lines = [f"{store.kind}: {len(trials)} SIGKILL trials: {dict(outcomes)}, neither: 0"]
    lines += [f"  {count:2d} x {phase}" for phase, count in sorted(phases.items())]
    return "\n".join(lines)


def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_checkpoint_loadable(
    any_store: Store, saver_server: SaverServer
) -> None:
    trials = run_kill_trials(any_store, saver_server)
    # Shown with -s, and kept in the test's report on failure.
    print("\n" + report(any_store, trials))
    assert len(trials) >= TRIALS[any_store.kind]
    outcomes = {trial.outcome for trial in trials}
    assert outcomes == {"old", "new"}, "the kills must land both before and after the commit point"
    assert len({trial.phase for trial in trials}) >= 5, "the kills must spread over the save"
