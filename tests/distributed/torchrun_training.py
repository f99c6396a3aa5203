"""A training loop as torchrun starts each rank, with no runner and no handler installed by hand.

``python -m torch.distributed.run --standalone --nproc-per-node N -m tests.distributed.torchrun_training OUT``

Each rank writes its pid to ``OUT/pid-<rank>`` (so the test can reap it: torchrun starts every
worker in its own session), trains with a gradient all-reduce per step, and votes on a preemption
every step with ``DistributedCheckpointManager.reached_preemption``. Rank 0 prints ``ready`` after
step 3. On the vote's ``True`` every rank saves that step under ``OUT/ckpt``, writes what it saw to
``OUT/rank-<rank>.json`` and raises ``manager.preemption()``, as the guide's loop does.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from flyte_checkpoint.distributed import DistributedCheckpointManager

STEP_SECONDS = 0.02
"""A step's "training": short, so a notice is voted on soon, without spinning both cores."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    (args.out / f"pid-{rank}").write_text(str(os.getpid()))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    manager = DistributedCheckpointManager(args.out / "ckpt")
    weights = torch.zeros(8)
    for step in range(1, args.steps + 1):
        weights.fill_(float(step))
        dist.all_reduce(torch.ones(4))  # the gradient all-reduce every rank waits in
        time.sleep(STEP_SECONDS)
        if rank == 0 and step == 3:
            print("ready", flush=True)
        if manager.reached_preemption(step):
            manager.save(step, {"weights": weights})
            preempted = manager.preemption()
            seen = {"step": step, "saved": preempted.saved, "code": preempted.code}
            (args.out / f"rank-{rank}.json").write_text(json.dumps(seen))
            raise preempted
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
