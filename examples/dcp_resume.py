"""Demo: train a small FSDP2 model on 4 CPU ranks, lose a rank mid-run, resume on 2 ranks.

Run it with ``python examples/dcp_resume.py`` (``--storage s3://bucket/prefix`` to keep the
checkpoints elsewhere than ``./flyte-checkpoints/<run id>/dcp``). It starts 4 gloo ranks that
train and save a DCP checkpoint after every step (``dcp.async_save`` through
``DistributedCheckpointManager``: every rank writes its own shard, the coordinator commits the
step atomically, the newest 2 steps are kept). Once step 3 is committed the demo SIGKILLs rank 1,
as a preempted node; the survivors fail. It then starts 2 ranks that load the last committed step,
resharded from 4 ranks to 2 by DCP, and train on to the end.

Each rank can also be started by torchrun, which sets ``RANK``, ``WORLD_SIZE`` and the rendezvous::

    torchrun --nproc-per-node 4 examples/dcp_resume.py train --storage DIR --steps 8
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from flyte_checkpoint.distributed import DistributedCheckpointManager

GLOBAL_BATCH = 32


class TrainingState:
    """Model and optimizer as DCP saves them (sharded), plus the step: a DCP ``Stateful``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        self.step = state["step"]


def build(world_size: int) -> TrainingState:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.children():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return TrainingState(model, torch.optim.Adam(model.parameters(), lr=0.01))


def batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the step's global batch: the same data whatever the world size."""
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(GLOBAL_BATCH, 16, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True).sin()
    share = GLOBAL_BATCH // world_size
    return inputs[rank * share : (rank + 1) * share], targets[rank * share : (rank + 1) * share]


def train(storage: str, steps: int, pause: float) -> None:
    """One rank's training loop (RANK, WORLD_SIZE, MASTER_ADDR/PORT set by the launcher)."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = build(world_size)
    # Background saves run DCP's collectives in another thread: give them their own group, so they
    # never interleave with FSDP's collectives on the default one.
    manager = DistributedCheckpointManager(storage, keep_last=2, process_group=dist.new_group(backend="gloo"))
    restored = manager.load({"app": state})
    if rank == 0:
        where = f"resumed from step {restored.step}" if restored else "starting fresh"
        print(f"{world_size} ranks: {where}", flush=True)
    pending: Any = None
    for step in range(state.step + 1, steps + 1):
        inputs, targets = batch(step, rank, world_size)
        loss = nn.functional.mse_loss(state.model(inputs), targets)
        state.optimizer.zero_grad()
        torch.autograd.backward(loss)
        state.optimizer.step()
        state.step = step
        if pending is not None:
            pending.result()  # one save in flight at a time
        pending = manager.async_save(step, {"app": state})
        if rank == 0:
            print(f"{world_size} ranks: step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(pause)
    if pending is not None:
        pending.result()
    if rank == 0:
        print(f"{world_size} ranks: done at step {state.step}; committed steps {manager.steps()}", flush=True)
    dist.destroy_process_group()


def _rank(rank: int, world_size: int, port: int, storage: str, steps: int, pause: float) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    train(storage, steps, pause)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(world_size: int, storage: str, steps: int, pause: float) -> list[Any]:
    # Ranks fork from a server that imported torch once: four fresh interpreters would each spend
    # seconds importing it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "flyte_checkpoint.distributed"])
    port = _free_port()
    processes = [
        context.Process(target=_rank, args=(rank, world_size, port, storage, steps, pause))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    return processes


def _stop(processes: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def demo(storage: str, steps: int) -> int:
    print(f"checkpoints under {storage}", flush=True)
    first = _start(4, storage, steps, pause=0.5)
    manager = DistributedCheckpointManager(storage)
    deadline = time.monotonic() + 120
    while (manager.latest_step() or 0) < 3 and time.monotonic() < deadline and first[1].is_alive():
        time.sleep(0.05)
    print(f"killing rank 1 with SIGKILL after step {manager.latest_step()} was committed", flush=True)
    if first[1].pid is not None:
        os.kill(first[1].pid, signal.SIGKILL)
    _stop(first, timeout=30)
    print(f"committed steps after the kill: {manager.steps()}", flush=True)
    second = _start(2, storage, steps, pause=0.0)
    _stop(second, timeout=120)
    return 0 if all(process.exitcode == 0 for process in second) else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", choices=["demo", "train"], default="demo")
    parser.add_argument("--storage", help="checkpoint root (a path or a storage URI)")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    storage = args.storage or str(Path("flyte-checkpoints") / uuid.uuid4().hex[:8] / "dcp")
    if args.mode == "train":
        train(storage, args.steps, pause=0.0)
        return 0
    return demo(storage, args.steps)


if __name__ == "__main__":
    sys.exit(main())
