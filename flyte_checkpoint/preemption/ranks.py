"""All ranks of a job agree on one step at which to stop for a preemption notice.

A notice rarely reaches every rank at once: a spot node's SIGTERM reaches the processes of that
node only, and the others learn of it when the node is gone. A rank acting on its own notice
deadlocks the job: it enters the collectives of a save that the other ranks never enter, while
they wait for it in the next gradient all-reduce, until the process-group timeout, which comes
after the SIGKILL. So the decision is a vote at a step boundary that every rank reaches:

* each rank gives the seconds its notice leaves (infinity without one) and its step;
* one all-reduce (MIN) gives every rank the same answer: stop at this step if any rank has a
  notice (a notice on one rank is enough), with the soonest deadline of all;
* a rank that learns of the notice from another records it as its own (:data:`PEER_SOURCE`),
  so its saves are bounded by that deadline and ``raise ...preemption()`` works there too;
* ranks that vote at different steps all get the same :class:`InvalidCheckpointInputError`
  rather than saving different steps (or waiting in collectives the others left).

Orbax agrees the same way out of band: its preemption sync manager, once a notice arrives,
collects every host's step through the JAX coordination service and sets the sync point to the
fastest host's next step, so its per-step call (``reached_preemption(step)``) is a local check.
torch.distributed has no such service, so the vote travels in band, as one small all-reduce per
call, costing what that collective costs (``benchmarks/preemption_ranks.py`` measures it).

:func:`reached_preemption` runs the vote on a ``torch.distributed`` process group; frameworks that
own their collectives (Lightning's strategy) reduce :func:`ballot` themselves and read the result
with :func:`count`. Nothing here imports torch until a process group is in use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from flyte_checkpoint.errors import InvalidCheckpointInputError
from flyte_checkpoint.preemption import notice

if TYPE_CHECKING:
    import torch

PEER_SOURCE = "a notice on another rank"
"""The source of the notice a rank records when the vote tells it another rank has one."""

NO_NOTICE = math.inf
"""A rank's vote without a notice: no deadline."""


def ballot(step: int) -> list[float]:
    """This rank's vote for ``step``: ``[seconds its notice leaves or inf, step, -step]``.

    Reduced with MIN across ranks: the soonest deadline, the lowest step and minus the highest.
    Reading the notice takes it over: the handler's watcher no longer ends the main thread under
    a training loop that votes.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidCheckpointInputError(f"step must be a non-negative int, not {step!r}")
    notice.take_over()
    current = notice.current_notice()
    seconds = NO_NOTICE if current is None else current.time_left()
    return [seconds, float(step), -float(step)]


def count(reduced: Sequence[float], step: int) -> bool:
    """Whether the vote reduced with MIN across ranks says stop at ``step`` (the same on every rank).

    A rank records the soonest deadline as :data:`PEER_SOURCE` unless its own notice is that one
    (a rank that learnt of the notice from another has a deadline and a notice to exit by). A notice
    that arrived here after this rank cast its vote counts at the next vote, never at this one, so
    every rank still returns the same answer.

    Raises:
        InvalidCheckpointInputError: the ranks voted at different steps (the same error on all).
    """
    seconds, lowest, highest = float(reduced[0]), int(reduced[1]), -int(reduced[2])
    if lowest != highest:
        raise InvalidCheckpointInputError(
            f"the ranks checked for a preemption at different steps ({lowest} to {highest}; this rank "
            f"at {step}): call reached_preemption at the same step boundary on every rank (every k "
            "steps with the same k everywhere), or ranks save different steps"
        )
    if seconds == NO_NOTICE:
        return False
    notice.notify(PEER_SOURCE, max(seconds, 0.0))  # kept only if sooner than a notice of its own
    return True


def reached_preemption(step: int, process_group: Any = None) -> bool:
    """Whether every rank of ``process_group`` stops at ``step`` for a preemption notice.

    A collective: call it on every rank at the same step boundary, every step or every k steps
    with the same k on every rank; all ranks get the same answer. On ``True`` save that step on
    every rank and exit (``raise ...preemption()``). One all-reduce of three float64 values, on the
    CPU for gloo, on the current CUDA device for nccl. Without a process group (or with one
    rank) it is this process's notice alone, and costs nothing.
    """
    vote = ballot(step)
    import torch.distributed as dist  # only now: callers without a process group need no torch

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(process_group) == 1:
        return vote[0] != NO_NOTICE
    import torch

    tensor = torch.tensor(vote, dtype=torch.float64, device=_device_of(process_group))
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=process_group)
    return count(tensor.tolist(), step)


def wait_for_every_rank(process_group: Any = None) -> None:
    """A barrier of ``process_group`` (nothing without one): ranks that stopped wait there for the
    rank still saving, so none exits first (torchrun stops every worker once one has exited)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        dist.barrier(group=process_group)


def _device_of(process_group: Any) -> torch.device:
    """Where the group's collectives take their tensors: CUDA for nccl, else the CPU (gloo, mpi,
    and a ``cpu:gloo,cuda:nccl`` group, whose CPU tensors go through gloo)."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(process_group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
