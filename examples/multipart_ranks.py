"""Demo: a coordinator and four rank processes save one multi-part checkpoint, then restore it.

Run it with ``python examples/multipart_ranks.py``. Each rank is a separate process (started with
``spawn``, with ``RANK`` and ``WORLD_SIZE`` in its environment as torchrun sets them); it writes
its own part straight to storage and hands the coordinator only an acknowledgement. The
coordinator waits for all four (bounded), then commits them with its own state in one atomic step.
On restore it verifies the whole checkpoint first, then each rank loads its own part.

Checkpoints go to ``./flyte-checkpoints/<run id>/multipart`` by default; pass ``--storage URI``
(``s3://bucket/prefix``, ...) to keep them elsewhere.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import uuid
from pathlib import Path
from typing import Any

from flyte_checkpoint.state import begin, commit, load_controller, load_part, verify_checkpoint, write_part

WORLD_SIZE = 4
STEP = 1000


class Shard:
    """One rank's share of a model: a few weights that depend on the rank and the step."""

    def __init__(self, rank: int, weights: list[float] | None = None) -> None:
        self.rank = rank
        self.weights = weights or []

    @classmethod
    def trained(cls, rank: int, step: int) -> Shard:
        return cls(rank, [round(rank + step / 1000 + index / 10, 2) for index in range(3)])

    def state_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "weights": list(self.weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rank = state["rank"]
        self.weights = list(state["weights"])


class Coordinator:
    """The coordinator's own state: where training stands."""

    def __init__(self, step: int = 0, learning_rate: float = 0.0) -> None:
        self.step = step
        self.learning_rate = learning_rate

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "learning_rate": self.learning_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]
        self.learning_rate = state["learning_rate"]


def as_launched_by_torchrun(rank: int) -> None:
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)


def rank_saves(checkpoint_dir: str, version_id: str, rank: int, results: Any) -> None:
    """A rank's save: its position comes from RANK, its bytes go straight to storage."""
    as_launched_by_torchrun(rank)
    ack = write_part(checkpoint_dir, None, Shard.trained(rank, STEP), version_id=version_id)
    results.put((rank, f"wrote part {ack.position}: {ack.size} bytes, digest {ack.digest}"))


def rank_restores(checkpoint_dir: str, version_id: str, rank: int, results: Any) -> None:
    """A rank's restore: a fresh shard, filled from its own, verified part of the pinned version."""
    as_launched_by_torchrun(rank)
    shard = Shard(rank)
    load_part(checkpoint_dir, None, shard, version_id=version_id)
    results.put((rank, f"restored weights {shard.weights}"))


def run_ranks(target: Any, checkpoint_dir: str, version_id: str) -> tuple[list[Any], Any]:
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    ranks = [
        spawn.Process(target=target, args=(checkpoint_dir, version_id, rank, results), name=f"rank-{rank}")
        for rank in range(WORLD_SIZE)
    ]
    for process in ranks:
        process.start()
    return ranks, results


def finish(ranks: list[Any], results: Any) -> None:
    """Print each rank's report in rank order; fail fast (not after a timeout) if a rank dies."""
    reports: dict[int, str] = {}
    while len(reports) < len(ranks):
        try:
            rank, report = results.get(timeout=0.2)
            reports[rank] = report
        except queue.Empty:
            failed = [process for process in ranks if process.exitcode not in (None, 0)]
            if failed:
                raise SystemExit(f"{failed[0].name} failed with exit code {failed[0].exitcode}") from None
    for process in ranks:
        process.join(30)
    results.close()
    for rank in sorted(reports):
        print(f"  rank {rank}: {reports[rank]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--storage", default=None, help="where checkpoints go (default ./flyte-checkpoints)")
    args = parser.parse_args(argv)
    base = args.storage.rstrip("/") if args.storage else str(Path("flyte-checkpoints").absolute())
    checkpoint_dir = f"{base}/{uuid.uuid4().hex[:12]}/multipart"
    print(f"checkpoint: {checkpoint_dir}")

    print(f"saving step {STEP}: a coordinator and {WORLD_SIZE} rank processes")
    version = begin(checkpoint_dir)
    ranks, results = run_ranks(rank_saves, checkpoint_dir, version)
    manifest = commit(
        checkpoint_dir,
        version,
        world_size=WORLD_SIZE,
        controller=Coordinator(step=STEP, learning_rate=0.0003),
        metadata={"step": STEP},
        workers=ranks,
        timeout=60,
    )
    finish(ranks, results)
    print(f"  committed version {manifest.version_id}: {manifest.world_size} parts + controller")

    print("restoring into fresh processes")
    verified = verify_checkpoint(checkpoint_dir, world_size=WORLD_SIZE)
    coordinator = Coordinator()
    metadata = load_controller(checkpoint_dir, coordinator, version_id=verified.version_id)
    print(f"  coordinator: step {coordinator.step}, learning rate {coordinator.learning_rate}")
    print(f"  metadata: {metadata}")
    ranks, results = run_ranks(rank_restores, checkpoint_dir, verified.version_id)
    finish(ranks, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
