"""Start N real gloo ranks, run one program of ``tests.distributed.programs`` in each, collect results.

Rank processes are forked from a forkserver that has imported torch and this package once, so a
4-rank launch costs a fraction of a second of CPU instead of four fresh interpreters. Nothing is
mocked: each rank initialises a real gloo process group over TCP on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.processes import free_port

PRELOAD = [
    "torch",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch._dynamo",  # fully_shard imports it on first use: 1.7 s per rank process otherwise
    "s3fs",
    "flyte_checkpoint.distributed",
    "tests.distributed.programs",
]
CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(PRELOAD)

LAUNCH_TIMEOUT = 120.0


class RankFailedError(AssertionError):
    """A rank raised, or did not answer in time."""


@dataclass
class Outcome:
    """How each rank of a launch ended: its result, or its error text, or its exit code."""

    results: dict[int, Any]
    errors: dict[int, str]
    exit_codes: dict[int, int | None]


def _rank_main(
    program: str, rank: int, world_size: int, port: int, args: Mapping[str, Any], answers: Any
) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
    )
    import torch.distributed as dist

    from tests.distributed import programs

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=_timeout(args))
        try:
            result = getattr(programs, program)(rank, world_size, dict(args))
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        # Plain pickle: tensors by value (torch's queue reducer shares memory with a process that exits).
        answers.put((rank, True, pickle.dumps(result)))
    except BaseException:
        answers.put((rank, False, traceback.format_exc()))


def _timeout(args: Mapping[str, Any]) -> Any:
    import datetime

    return datetime.timedelta(seconds=float(args.get("pg_timeout", 60)))


def launch(
    program: str,
    world_size: int,
    args: Mapping[str, Any],
    *,
    timeout: float = LAUNCH_TIMEOUT,
    kill_after: tuple[int, float] | None = None,
) -> Outcome:
    """Run ``programs.<program>`` on ``world_size`` ranks; every process is reaped before returning.

    ``kill_after=(rank, seconds)`` SIGKILLs that rank that long after the start (a preempted node).
    """
    answers = CONTEXT.Queue()
    port = free_port()
    processes = [
        CONTEXT.Process(target=_rank_main, args=(program, rank, world_size, port, dict(args), answers))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    killed = False
    try:
        while len(results) + len(errors) < world_size and time.monotonic() < deadline:
            if (
                kill_after is not None
                and not killed
                and time.monotonic() >= deadline - timeout + kill_after[1]
            ):
                _kill(processes[kill_after[0]])
                killed = True
            try:
                rank, ok, value = answers.get(timeout=0.02)
            except queue.Empty:
                if all(not process.is_alive() for process in processes):
                    break
                continue
            _record(results, errors, rank, ok, value)
        # Drain what arrived after the last rank exited.
        with contextlib.suppress(queue.Empty):
            while True:
                rank, ok, value = answers.get(timeout=0.05)
                _record(results, errors, rank, ok, value)
    finally:
        for process in processes:
            process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if process.is_alive():
                _kill(process)
                process.join()
        answers.close()
        answers.join_thread()
    return Outcome(results, errors, {rank: process.exitcode for rank, process in enumerate(processes)})


def _record(results: dict[int, Any], errors: dict[int, str], rank: int, ok: bool, value: Any) -> None:
    if ok:
        results[rank] = pickle.loads(value)
    else:
        errors[rank] = value


def _kill(process: Any) -> None:
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.kill(process.pid, signal.SIGKILL)


def run(
    program: str, world_size: int, args: Mapping[str, Any], *, timeout: float = LAUNCH_TIMEOUT
) -> list[Any]:
    """Like :func:`launch`, but every rank must succeed; the results by rank."""
    outcome = launch(program, world_size, args, timeout=timeout)
    if outcome.errors or len(outcome.results) != world_size:
        details = "\n".join(f"rank {rank}: {text}" for rank, text in sorted(outcome.errors.items()))
        raise RankFailedError(
            f"{program} on {world_size} ranks: results from {sorted(outcome.results)}, exit codes "
            f"{outcome.exit_codes}\n{details}"
        )
    return [outcome.results[rank] for rank in range(world_size)]
