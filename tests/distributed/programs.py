"""What each rank runs in the distributed tests (imported by the forkserver, run by ``ranks.launch``).

Each program gets its rank, the world size and a dict of JSON-like arguments, runs inside an
initialised gloo process group, and returns a picklable result. The model is an FSDP2
(``fully_shard``) model on CPU whose parameters are fixed by a seed, so the parent can compute
the exact full tensors any load must give back.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.futures import Future

from flyte_checkpoint.distributed import (
    CheckpointReader,
    CheckpointWriter,
    DistributedCheckpointManager,
    task_locations,
)

WIDTH = 24


def tiny_model(seed: int) -> nn.Module:
    """The same parameters for the same seed, on every rank and in the parent."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 12))


def full_state(seed: int) -> dict[str, torch.Tensor]:
    """The unsharded parameters of ``tiny_model(seed)`` (what a load of that save must give)."""
    return {name: tensor.detach().clone() for name, tensor in tiny_model(seed).state_dict().items()}


def sharded_model(seed: int, world_size: int) -> nn.Module:
    model = tiny_model(seed)
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.children():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def app_state(model: nn.Module, seed: int) -> dict[str, Any]:
    """What is saved: the sharded model, and plain values DCP stores as blobs."""
    return {"model": model.state_dict(), "extra": {"seed": seed, "note": f"saved with seed {seed}"}}


def gathered(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full parameters of an FSDP model (a collective: every rank calls it)."""
    return {name: tensor.full_tensor().clone() for name, tensor in model.state_dict().items()}


# --------------------------------------------------------------------------- fault injection


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillingWriter(CheckpointWriter):
    """A writer whose process SIGKILLs itself at one planned point of a save (a preempted node)."""

    def __init__(self, *args: Any, kill_rank: int, kill_point: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kill_rank = kill_rank
        self.kill_point = kill_point

    def _here(self, point: str) -> bool:
        return self.kill_point == point and self.rank == self.kill_rank

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self._here("before_write"):
            _die()
        if self._here("mid_write"):
            items = len(plan.items)
            resolve = planner.resolve_data
            count = 0

            def resolve_then_die(item: WriteItem) -> Any:
                nonlocal count
                count += 1
                if count > items // 2:
                    _die()
                return resolve(item)

            planner.resolve_data = resolve_then_die  # type: ignore[method-assign,assignment]
        future = super().write_data(plan, planner)
        if self._here("after_write"):
            _die()
        return future

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        if self._here("before_metadata"):
            _die()
        if self._here("before_pointer") or self._here("after_pointer"):
            # At the storage seam, not inside flyte_checkpoint.state: the pointer is the one write
            # to COMMITTED.json, and garbage collection after it deletes the older version.
            backend = type(self.backend)
            open_write, delete_prefix = backend.open_write, backend.delete_prefix

            def die_at_pointer(this: Any, uri: str, *args: Any, **kwargs: Any) -> Any:
                if uri.endswith("/COMMITTED.json"):
                    _die()
                return open_write(this, uri, *args, **kwargs)

            def die_collecting(this: Any, uri: str) -> None:
                _die()

            if self.kill_point == "before_pointer":
                backend.open_write = die_at_pointer  # type: ignore[method-assign,assignment]
            else:
                backend.delete_prefix = die_collecting  # type: ignore[method-assign,assignment]
            try:
                super().finish(metadata, results)
            finally:
                backend.open_write = open_write  # type: ignore[method-assign]
                backend.delete_prefix = delete_prefix  # type: ignore[method-assign]
            return
        super().finish(metadata, results)


# --------------------------------------------------------------------------- programs


def save(rank: int, world_size: int, args: dict[str, Any]) -> str | None:
    """Save the model of ``seed``; ``mode``: sync, thread or process; optionally die at ``kill``."""
    seed = int(args["seed"])
    model = sharded_model(seed, world_size)
    options = args.get("storage_options")
    kill = args.get("kill")
    writer: CheckpointWriter
    if kill is not None:
        writer = KillingWriter(args["root"], storage_options=options, kill_rank=kill[0], kill_point=kill[1])
    else:
        writer = CheckpointWriter(args["root"], storage_options=options, metadata={"seed": seed})
    mode = args.get("mode", "sync")
    state = app_state(model, seed)
    if mode == "sync":
        dcp_save(state, storage_writer=writer)
    else:
        kind = AsyncCheckpointerType.THREAD if mode == "thread" else AsyncCheckpointerType.PROCESS
        future = dcp_async_save(state, storage_writer=writer, async_checkpointer_type=kind)
        # Training would go on here; the parameters may change once staging is done.
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1000.0)
        result = future.result() if hasattr(future, "result") else future.upload_completion.result()
        del result
    return writer.version_id


def load(rank: int, world_size: int, args: dict[str, Any]) -> dict[str, Any] | None:
    """Load into a model of another seed; rank 0 returns the full parameters and the blobs."""
    model = sharded_model(int(args.get("init_seed", 999)), world_size)
    state = app_state(model, -1)
    dcp_load(
        state, storage_reader=CheckpointReader(args["root"], storage_options=args.get("storage_options"))
    )
    full = gathered(model)
    return {"params": full, "extra": state["extra"]} if rank == 0 else None


def manager_steps(rank: int, world_size: int, args: dict[str, Any]) -> dict[str, Any]:
    """Save ``steps`` with a manager (``keep_last``), then load the newest that verifies."""
    manager = DistributedCheckpointManager(
        args["root"], keep_last=args.get("keep_last"), storage_options=args.get("storage_options")
    )
    for step in args.get("save", []):
        model = sharded_model(step, world_size)
        manager.save(step, app_state(model, step))
    model = sharded_model(999, world_size)
    state = app_state(model, -1)
    restored = manager.load(state)
    return {
        "steps": manager.steps(),
        "restored": None if restored is None else restored.step,
        "params": gathered(model),
        "extra": state["extra"],
    }


def flyte_attempt(rank: int, world_size: int, args: dict[str, Any]) -> dict[str, Any]:
    """One Flyte task attempt: resume from the last committed step, train, save each step, maybe die."""
    from flyte_checkpoint.context import CheckpointPaths, TaskContext, task_context

    paths = CheckpointPaths(checkpoint_path=args["checkpoint_path"], prev_checkpoint_path=args.get("prev"))
    with task_context(TaskContext(checkpoint_paths=paths, storage_options=args.get("storage_options"))):
        where = task_locations()
        manager = DistributedCheckpointManager(
            where.save_root,
            resume_from=where.resume_root,
            keep_last=2,
            storage_options=args.get("storage_options"),
        )
        model = sharded_model(0, world_size)
        state = app_state(model, 0)
        restored = manager.load(state)
        start = restored.step if restored is not None else 0
        for step in range(start + 1, int(args["until"]) + 1):
            model = sharded_model(step, world_size)
            manager.save(step, app_state(model, step))
            if step == args.get("die_after"):
                dist.barrier()
                _die()
        return {"resumed": start, "steps": manager.steps()}


def save_series(rank: int, world_size: int, args: dict[str, Any]) -> list[int]:
    """Save ``seeds`` one after another (the parent SIGKILLs some rank at a random instant)."""
    saved = []
    for seed in args["seeds"]:
        model = sharded_model(seed, world_size)
        dcp_save(
            app_state(model, seed),
            storage_writer=CheckpointWriter(args["root"], storage_options=args.get("storage_options")),
        )
        saved.append(seed)
    return saved


def train_until_preempted(rank: int, world_size: int, args: dict[str, Any]) -> dict[str, Any]:
    """Train with a gradient all-reduce per step, vote on a preemption every step, and when the vote
    says so save that step and stop; ranks send themselves SIGTERM (``sigterm``: [rank or list of
    ranks, step], or ``sigterm_after``: [rank, seconds] from a timer thread, at a random instant of
    the loop). ``"handler": false``: no handler installed beforehand, as under torchrun alone."""
    import contextlib
    import threading

    from flyte_checkpoint.preemption import current_notice, install_preemption_handler

    grace = float(args.get("grace", 30))
    manager = DistributedCheckpointManager(args["root"])  # the rank's process ends with the program
    victims, at_step = args.get("sigterm", [None, None])
    victims = victims if isinstance(victims, list) else [victims]
    timer = None
    if "sigterm_after" in args and rank == args["sigterm_after"][0]:
        timer = threading.Timer(float(args["sigterm_after"][1]), os.kill, (os.getpid(), signal.SIGTERM))
    handler = install_preemption_handler(grace_seconds=grace) if args.get("handler", True) else None
    with handler or contextlib.nullcontext():
        model = sharded_model(0, world_size)
        for step in range(1, int(args.get("steps", 2000)) + 1):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.fill_(float(step))  # "training": every value is the step
            dist.all_reduce(torch.ones(4))  # the gradient all-reduce every rank waits in
            if rank in victims and step == at_step:
                os.kill(os.getpid(), signal.SIGTERM)
            voted = step + int(args.get("skew", {}).get(str(rank), 0))
            reached = manager.reached_preemption(voted)
            if timer is not None and step == 1:
                timer.start()  # after the first vote: from then on the loop handles the notice
            if reached:
                manager.save(step, app_state(model, step))
                current = current_notice()
                assert current is not None
                preempted = manager.preemption()
                return {
                    "saved": step,
                    "source": current.source,
                    "steps": manager.steps(),
                    "committed": preempted.saved,
                    "code": preempted.code,
                }
    return {"saved": None}
