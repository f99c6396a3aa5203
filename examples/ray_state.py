"""Demo: a controller and three storage units as Ray actors, checkpointed and restored by position.

Run it with ``python examples/ray_state.py`` (needs the ``ray`` extra). It starts a local Ray
instance, fills the actors, and saves them as one checkpoint: each actor writes its own part
straight to the checkpoint location and the driver commits the acknowledgements, so no payload
passes through the driver. Then it shows that a save whose actor dies raises at once and leaves
the committed checkpoint alone, and restores everything into freshly created actors, matched by
position.

Checkpoints go to ``./flyte-checkpoints/<run id>/ray-state`` by default; pass ``--storage URI``
(``s3://bucket/prefix``, ...; with several machines use an object store or a shared filesystem).
"""

from __future__ import annotations

import argparse
import threading
import uuid
from pathlib import Path
from typing import Any

import ray

from flyte_checkpoint.errors import CheckpointPartError
from flyte_checkpoint.state import StateCheckpoint

UNITS = 3
STEP = 1000


class StorageUnit:
    """Holds samples in its own process; a component because it has state_dict/load_state_dict."""

    def __init__(self) -> None:
        self.samples: dict[int, str] = {}

    def put(self, index: int, sample: str) -> None:
        self.samples[index] = sample

    def state_dict(self) -> dict[int, str]:
        return dict(self.samples)

    def load_state_dict(self, state: dict[int, str]) -> None:
        self.samples = dict(state)

    def describe(self) -> str:
        return ", ".join(f"{index}={sample}" for index, sample in sorted(self.samples.items()))


class Controller:
    """Knows which samples were produced; saved and restored with the units, as one state."""

    def __init__(self) -> None:
        self.produced: list[int] = []

    def produced_up_to(self, count: int) -> None:
        self.produced = list(range(count))

    def state_dict(self) -> dict[str, Any]:
        return {"produced": list(self.produced)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.produced = list(state["produced"])

    def describe(self) -> str:
        return f"produced {self.produced}"


# Actors need no CPU of their own here: the demo fits a one-CPU Ray instance.
RemoteController = ray.remote(num_cpus=0)(Controller)
RemoteStorageUnit = ray.remote(num_cpus=0)(StorageUnit)


def start_actors() -> tuple[Any, list[Any]]:
    return RemoteController.remote(), [RemoteStorageUnit.remote() for _ in range(UNITS)]


def kill(actor: Any) -> None:
    """Kill ``actor`` and wait until Ray reports it dead (``ray.kill`` only asks for it)."""
    ray.kill(actor)
    while True:
        try:
            ray.get(actor.describe.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--storage", default=None, help="where checkpoints go (default ./flyte-checkpoints)")
    args = parser.parse_args(argv)
    base = args.storage.rstrip("/") if args.storage else str(Path("flyte-checkpoints").absolute())
    checkpoint = StateCheckpoint(f"{base}/{uuid.uuid4().hex[:12]}/ray-state", timeout=60)
    print(f"checkpoint: {checkpoint.root}")

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        controller, units = start_actors()
        lock = threading.Lock()  # every mutation takes it, and waits for its actor calls inside
        with lock:
            ray.get([unit.put.remote(index, f"sample-{index}") for index, unit in enumerate(units)])
            ray.get(controller.produced_up_to.remote(UNITS))

        manifest = checkpoint.save(controller=controller, parts=units, metadata={"step": STEP}, lock=lock)
        print(f"saved version {manifest.version_id}: {manifest.world_size} parts + controller")
        for part in manifest.parts:
            print(f"  part {part.position}: {part.size} bytes, digest {part.digest}")

        kill(units[1])
        try:
            checkpoint.save(controller=controller, parts=units, metadata={"step": STEP + 1})
        except CheckpointPartError as error:
            print(f"a save with a dead actor failed at once: part {error.position} ({type(error).__name__})")
        print(f"committed checkpoint still: step {checkpoint.verify().metadata['step']}")

        for actor in [controller, *units]:
            ray.kill(actor)
        print("restoring into fresh actors")
        controller, units = start_actors()
        restored = checkpoint.load(controller=controller, parts=units)
        print(f"  metadata: {restored.metadata}")
        print(f"  controller: {ray.get(controller.describe.remote())}")
        for index, unit in enumerate(units):
            print(f"  unit {index}: {ray.get(unit.describe.remote())}")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
