"""Demo: a coordinator and four rank processes save one multi-part checkpoint, then restore it.

Run it with ``python examples/multipart_ranks.py``. Each rank is a separate process (started with
``spawn``, with ``RANK`` and ``WORLD_SIZE`` in its environment as torchrun sets them); it writes
its own part straight to storage and hands the coordinator only an acknowledgement, over a queue
here (a torch.distributed gather or Ray return values serve the same way). The coordinator
gathers all four, then commits them with its own state in one atomic step. On restore it
verifies the whole checkpoint first, then each rank loads its own part.

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

from flyte_checkpoint.state import PartAck, StateCheckpoint

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


def rank_saves(checkpoint: StateCheckpoint, version_id: str, rank: int, results: Any) -> None:
    """A rank's save: its position comes from RANK, its bytes go straight to storage."""
    as_launched_by_torchrun(rank)
    ack = checkpoint.write_part(None, Shard.trained(rank, STEP), version_id=version_id)
    results.put((rank, f"wrote part {ack.position}: {ack.size} bytes, digest {ack.digest}", ack))


def rank_restores(checkpoint: StateCheckpoint, version_id: str, rank: int, results: Any) -> None:
    """A rank's restore: a fresh shard, filled from its own, verified part of the pinned version."""
    as_launched_by_torchrun(rank)
    shard = Shard(rank)
    checkpoint.load_part(None, shard, version_id=version_id)
    results.put((rank, f"restored weights {shard.weights}", None))


def run_ranks(target: Any, checkpoint: StateCheckpoint, version_id: str) -> tuple[list[Any], Any]:
    """Start one process per rank; each gets the checkpoint (it pickles with its configuration)."""
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    ranks = [
        spawn.Process(target=target, args=(checkpoint, version_id, rank, results), name=f"rank-{rank}")
        for rank in range(WORLD_SIZE)
    ]
    for process in ranks:
        process.start()
    return ranks, results


def gather(ranks: list[Any], results: Any) -> list[PartAck]:
    """Print each rank's report in rank order and return the acks it sent; fail fast (not after a
    timeout) if a rank dies."""
    reports: dict[int, str] = {}
    acks: list[PartAck] = []
    while len(reports) < len(ranks):
        try:
            rank, report, ack = results.get(timeout=0.2)
            reports[rank] = report
            if ack is not None:
                acks.append(ack)
        except queue.Empty:
            failed = [process for process in ranks if process.exitcode not in (None, 0)]
            if failed:
                raise SystemExit(f"{failed[0].name} failed with exit code {failed[0].exitcode}") from None
    for process in ranks:
        process.join(30)
    results.close()
    for rank in sorted(reports):
        print(f"  rank {rank}: {reports[rank]}")
    return acks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--storage", default=None, help="where checkpoints go (default ./flyte-checkpoints)")
    args = parser.parse_args(argv)
    base = args.storage.rstrip("/") if args.storage else str(Path("flyte-checkpoints").absolute())
    checkpoint_dir = f"{base}/{uuid.uuid4().hex[:12]}/multipart"
    print(f"checkpoint: {checkpoint_dir}")

    checkpoint = StateCheckpoint(checkpoint_dir, timeout=60)

    print(f"saving step {STEP}: a coordinator and {WORLD_SIZE} rank processes")
    version = checkpoint.begin()
    ranks, results = run_ranks(rank_saves, checkpoint, version)
    acks = gather(ranks, results)
    manifest = checkpoint.commit_version(
        version, acks, controller=Coordinator(step=STEP, learning_rate=0.0003), metadata={"step": STEP}
    )
    print(f"  committed version {manifest.version_id}: {manifest.world_size} parts + controller")

    print("restoring into fresh processes")
    verified = checkpoint.verify(world_size=WORLD_SIZE)
    coordinator = Coordinator()
    restored = checkpoint.load_controller(coordinator, version_id=verified.version_id)
    print(f"  coordinator: step {coordinator.step}, learning rate {coordinator.learning_rate}")
    print(f"  metadata: {restored.metadata}")
    ranks, results = run_ranks(rank_restores, checkpoint, verified.version_id)
    gather(ranks, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
