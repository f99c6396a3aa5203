"""Components that live in Ray actors, for the tests: plain classes, made actors by the tests.

They are importable by module name, so Ray's workers (whose ``sys.path`` starts with the
driver's) find the same code the driver pickles.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

_HOLD_SECONDS = 60.0


class Unit:
    """A storage unit: a dict of samples and the generation that last wrote it.

    ``hold_in(stage, directory)`` makes the next ``state_dict`` (``stage="save"``) or
    ``load_state_dict`` (``stage="load"``) announce itself by creating ``directory/entered`` and
    then wait until ``directory/release`` exists: the tests kill the actor, remove its node, or
    let a deadline pass at exactly that point.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.samples: dict[str, Any] = {}
        self.generation = 0
        self._hold: tuple[str, Path] | None = None
        self._fail_load = False

    def reset(self) -> None:
        """Back to a fresh unit (the tests reuse actors: starting one takes a second)."""
        self.samples = {}
        self.generation = 0
        self._hold = None
        self._fail_load = False

    def put(self, key: str, value: Any, generation: int) -> None:
        self.samples[key] = value
        self.generation = generation

    def snapshot(self) -> dict[str, Any]:
        return {"samples": dict(self.samples), "generation": self.generation}

    def hold_in(self, stage: str, directory: str) -> None:
        self._hold = (stage, Path(directory))

    def fail_next_load(self) -> None:
        self._fail_load = True

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def pid(self) -> int:
        return os.getpid()

    def state_dict(self) -> dict[str, Any]:
        self._wait_if_held("save")
        return {"samples": dict(self.samples), "generation": self.generation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._wait_if_held("load")
        self.samples = dict(state["samples"])
        if self._fail_load:
            self._fail_load = False
            raise RuntimeError(f"unit {self.name} cannot take this state")
        self.generation = state["generation"]

    def _wait_if_held(self, stage: str) -> None:
        if self._hold is None or self._hold[0] != stage:
            return
        directory = self._hold[1]
        self._hold = None
        (directory / "entered").touch()
        deadline = time.monotonic() + _HOLD_SECONDS
        while not (directory / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)


class NotAComponent:
    """An actor with neither state_dict/load_state_dict nor save_to_path/load_from_path."""

    def ping(self) -> str:
        return "pong"
