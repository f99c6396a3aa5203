"""Known limitation 2 of the spec: a save concurrent with mutations must never mix states.

Every component's state is captured inside the caller's lock (or pause hook) before any byte is
written, so a mutation that takes the same lock lands wholly before or wholly after the snapshot.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint.state import load_checkpoint, save_checkpoint
from tests.state.workers import Controller, Unit
from tests.stores import Store

UNITS = 3


class System:
    """A controller and storage units with one invariant: produced indexes == stored indexes.

    ``put`` stores before it marks produced and ``clear`` unmarks before it deletes (the spec's
    order), each step yielding the GIL, so an unlocked snapshot can fall between two steps.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.controller = Controller()
        self.units = [Unit() for _ in range(UNITS)]
        self.mutations = 0

    def put(self, index: int) -> None:
        with self.lock:
            self.units[index % UNITS].data[index] = f"sample {index}"
            time.sleep(0)
            self.controller.produced.add(index)
            self.mutations += 1

    def clear(self, index: int) -> None:
        with self.lock:
            self.controller.produced.discard(index)
            time.sleep(0)
            self.units[index % UNITS].data.pop(index, None)
            self.mutations += 1


class SlowUnit(Unit):
    """A unit whose snapshot takes a while, widening the window for an interleaved mutation."""

    def __init__(self, unit: Unit) -> None:
        self._unit = unit

    def state_dict(self) -> dict[str, Any]:
        time.sleep(0.002)
        return self._unit.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._unit.load_state_dict(state)


def invariant_violations(controller: Controller, units: list[Unit]) -> list[str]:
    stored = {index for unit in units for index in unit.data}
    problems = []
    if controller.produced - stored:
        problems.append(f"produced but not stored: {sorted(controller.produced - stored)}")
    if stored - controller.produced:
        problems.append(f"stored but not produced: {sorted(stored - controller.produced)}")
    return problems


@contextlib.contextmanager
def mutating(system: System) -> Iterator[None]:
    """A thread that puts and clears samples for as long as the block runs."""
    stop = threading.Event()

    def run() -> None:
        index = 0
        while not stop.is_set():
            system.put(index)
            if index >= 3:
                system.clear(index - 3)
            index += 1

    thread = threading.Thread(target=run, name="mutator")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_a_thread_mutating_components_throughout_many_saves_never_yields_a_mixed_checkpoint(
    local_store: Store,
) -> None:
    lock = threading.Lock()
    system = System(lock)
    checkpoint_dir = local_store.uri("ckpt")
    saves = 25
    with mutating(system):
        for _ in range(saves):
            before = system.mutations
            save_checkpoint(
                checkpoint_dir,
                controller=system.controller,
                parts=[SlowUnit(unit) for unit in system.units],
                lock=lock,
            )
            controller, units = Controller(), [Unit() for _ in range(UNITS)]
            load_checkpoint(checkpoint_dir, controller=controller, parts=units)
            assert invariant_violations(controller, units) == []
            assert system.mutations > before, "the mutator must run during every save"
    assert system.mutations > saves


class _Handshake:
    """Forces the interleaving the spec warns about: a clear between the controller's snapshot
    and the storage units' snapshot, whenever nothing prevents it."""

    def __init__(self) -> None:
        self.controller_captured = threading.Event()
        self.cleared = threading.Event()


class _SignallingController(Controller):
    def __init__(self, controller: Controller, handshake: _Handshake) -> None:
        self._controller = controller
        self._handshake = handshake

    def state_dict(self) -> dict[str, Any]:
        state = self._controller.state_dict()
        self._handshake.controller_captured.set()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - never loaded
        self._controller.load_state_dict(state)


class _WaitingUnit(Unit):
    def __init__(self, unit: Unit, handshake: _Handshake) -> None:
        self._unit = unit
        self._handshake = handshake

    def state_dict(self) -> dict[str, Any]:
        # Under the lock the clear cannot happen; waiting briefly then proves it did not.
        self._handshake.cleared.wait(0.3)
        return self._unit.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - never loaded
        self._unit.load_state_dict(state)


@pytest.mark.parametrize(("use_lock", "mixed"), [(True, False), (False, True)])
def test_a_clear_between_two_snapshots_mixes_states_only_without_the_lock(
    local_store: Store, use_lock: bool, mixed: bool
) -> None:
    """Without the lock (the spec's design) the checkpoint mixes states; with it, never."""
    lock = threading.Lock()
    system = System(lock)
    for index in range(UNITS):
        system.put(index)
    handshake = _Handshake()

    def clear_after_the_controller_snapshot() -> None:
        handshake.controller_captured.wait(10)
        system.clear(0)
        handshake.cleared.set()

    clearer = threading.Thread(target=clear_after_the_controller_snapshot, name="clearer")
    clearer.start()
    try:
        checkpoint_dir = Path(local_store.uri("ckpt"))
        save_checkpoint(
            checkpoint_dir,
            controller=_SignallingController(system.controller, handshake),
            # Sample 0 lives in unit 0: its snapshot is the one a clear of 0 must not precede.
            parts=[_WaitingUnit(system.units[0], handshake), *system.units[1:]],
            lock=lock if use_lock else None,
        )
    finally:
        clearer.join(10)
    controller, units = Controller(), [Unit() for _ in range(UNITS)]
    load_checkpoint(checkpoint_dir, controller=controller, parts=units)
    assert bool(invariant_violations(controller, units)) is mixed


def test_a_pause_hook_is_entered_around_the_snapshot_and_left_before_writing(local_store: Store) -> None:
    events: list[str] = []
    checkpoint_dir = Path(local_store.uri("ckpt"))

    @contextlib.contextmanager
    def paused() -> Iterator[None]:
        events.append("pause")
        yield
        events.append("resume")

    class Recording(Unit):
        def state_dict(self) -> dict[str, Any]:
            events.append("capture" + (" (nothing written yet)" if not checkpoint_dir.exists() else ""))
            return super().state_dict()

    save_checkpoint(checkpoint_dir, controller=None, parts=[Recording(), Recording()], lock=paused)
    assert events == ["pause", "capture (nothing written yet)", "capture (nothing written yet)", "resume"]
