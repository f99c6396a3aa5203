"""A SIGTERM on one rank of a 4-rank job: do all ranks save the same step and exit, and how fast?

Run from the repository root with the project's venv::

    python benchmarks/preemption_ranks.py --trials 5          # agreed stop, 5 random instants
    python benchmarks/preemption_ranks.py --trials 2 --local  # also each rank acting alone

Each trial starts 4 gloo ranks on this machine. Every rank trains (``--step-ms`` of work, then a
gradient all-reduce) and calls ``DistributedCheckpointManager.reached_preemption(step)`` every
step; on ``True`` it saves that step (``manager.save``) and ends with ``manager.preemption()``,
as a task does. Once every rank has voted once, the parent sends SIGTERM to one random rank at a
random instant (up to ``--max-delay`` seconds later) and waits for every process to exit. Per
trial the table shows the rank that got the signal, the step each rank saved, whether all exited
(and their exit statuses: 143 is ``Preempted`` after SIGTERM), the seconds from the signal to the
last exit, and the newest committed step the parent then lists.

``--signal-all`` sends the SIGTERM to every rank at once instead, as ``torchrun`` does: its agent
gets the kubelet's SIGTERM and forwards it to each worker.

``--local`` adds trials of the baseline the vote replaces: each rank stops on its own notice
only. The signalled rank then saves alone and waits in the save's collectives for ranks that
went on training; the trial ends only when the process-group timeout (``--pg-timeout``) breaks
the job, with nothing saved.

The cost of the vote itself: ``reached_preemption`` called ``--vote-calls`` times back to back
on 4 ranks, against a bare all-reduce of the same three float64 values; microseconds per call.

Importable: ``run(trials, ...)`` returns one dict per trial, ``vote_cost(...)`` the costs, and
``format_table(results)`` the table (``benchmarks/preemption.py`` calls them).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import multiprocessing
import os
import queue
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.lib.processes import free_port  # noqa: E402 - importable once REPO is on sys.path

WORLD = 4
STARTUP_TIMEOUT = 120.0
"""Seconds the ranks may take to start and vote once (a loaded CI machine stalls)."""


# --------------------------------------------------------------------------- what runs in each rank


def train(rank: int, world: int, task: dict[str, Any], say: Any) -> None:
    """Train until the ranks stop for a preemption; save that step and end as preempted."""
    import torch
    import torch.distributed as dist

    from flyte_checkpoint.distributed import DistributedCheckpointManager
    from flyte_checkpoint.preemption import current_notice, install_preemption_handler
    from flyte_checkpoint.preemption.notice import take_over

    manager = DistributedCheckpointManager(task["root"])
    agreed = task["mode"] == "agreed"
    weights = torch.zeros(1024)
    with install_preemption_handler(grace_seconds=float(task["grace_seconds"])):
        for step in range(1, int(task["max_steps"]) + 1):
            time.sleep(float(task["step_seconds"]))  # the forward and backward pass
            gradient = torch.ones(1024)
            dist.all_reduce(gradient)
            weights += gradient
            if agreed:
                stop = manager.reached_preemption(step)
            else:  # the baseline: this rank's own notice only
                take_over()
                stop = current_notice() is not None
            if step == 1:
                say(("ready", os.getpid()))
            if stop:
                manager.save(step, {"weights": weights})
                found = current_notice()
                say(("saved", step, found.source if found is not None else None))
                raise manager.preemption()
    say(("finished", int(task["max_steps"])))


def measure_votes(rank: int, world: int, task: dict[str, Any], say: Any) -> None:
    """Microseconds per ``reached_preemption`` call and per bare all-reduce (rank 0 reports)."""
    import torch
    import torch.distributed as dist

    from flyte_checkpoint.distributed import DistributedCheckpointManager

    manager = DistributedCheckpointManager(task["root"])
    calls = int(task["calls"])

    def per_call(body: Any) -> float:
        dist.barrier()
        started = time.perf_counter()
        for step in range(calls):
            body(step)
        return (time.perf_counter() - started) / calls * 1e6

    def bare(step: int) -> None:
        dist.all_reduce(torch.zeros(3, dtype=torch.float64), op=dist.ReduceOp.MIN)

    votes, bares = [], []
    for _ in range(int(task["repeats"])):
        votes.append(per_call(manager.reached_preemption))
        bares.append(per_call(bare))
    if rank == 0:
        say(("cost", statistics.median(votes), statistics.median(bares)))


PROGRAMS = {"train": train, "measure_votes": measure_votes}


def _rank_main(rank: int, world: int, port: int, task: dict[str, Any], answers: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(task["pg_timeout"]))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    try:
        PROGRAMS[task["program"]](rank, world, task, lambda note: answers.put((rank, note)))
    except SystemExit:
        raise  # Preempted: the process exits with its status (143 after SIGTERM)
    except BaseException:
        answers.put((rank, ("error", traceback.format_exc(limit=3))))
        raise SystemExit(1) from None
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# --------------------------------------------------------------------------- the parent


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "flyte_checkpoint.distributed"])
    return context


class _Job:
    """``world`` started rank processes, their notes, and reaping them whatever happens."""

    def __init__(self, task: dict[str, Any], world: int = WORLD) -> None:
        context = _context()
        self.answers = context.Queue()
        port = free_port()
        self.processes = [
            context.Process(target=_rank_main, args=(rank, world, port, task, self.answers))
            for rank in range(world)
        ]
        self.notes: dict[int, list[tuple[Any, ...]]] = {rank: [] for rank in range(world)}
        for process in self.processes:
            process.start()

    def collect(self, timeout: float) -> None:
        try:
            rank, note = self.answers.get(timeout=timeout)
        except queue.Empty:
            return
        self.notes[rank].append(note)

    def first(self, rank: int, kind: str) -> tuple[Any, ...] | None:
        return next((note for note in self.notes[rank] if note[0] == kind), None)

    def wait_until(self, done: Any, timeout: float) -> bool:
        give_up = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= give_up:
                return False
            self.collect(0.01)
        return True

    def running(self) -> bool:
        return any(process.is_alive() for process in self.processes)

    def close(self) -> dict[int, int | None]:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()
        while True:  # notes sent just before exiting
            try:
                rank, note = self.answers.get(timeout=0.05)
            except queue.Empty:
                break
            self.notes[rank].append(note)
        self.answers.close()
        self.answers.join_thread()
        return {rank: process.exitcode for rank, process in enumerate(self.processes)}


def _trial(
    task: dict[str, Any], chooser: random.Random, max_delay: float, exit_timeout: float, signal_all: bool
) -> dict[str, Any]:
    job = _Job(task)
    victim = chooser.randrange(WORLD)
    victims = range(WORLD) if signal_all else [victim]
    delay = chooser.uniform(0.0, max_delay)
    seconds_to_exit: float | None = None
    try:
        ready = job.wait_until(
            lambda: all(job.first(rank, "ready") or job.first(rank, "error") for rank in range(WORLD)),
            STARTUP_TIMEOUT,
        )
        if ready and not any(job.first(rank, "error") for rank in range(WORLD)):
            time.sleep(delay)
            signalled = time.monotonic()
            for rank in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(job.processes[rank].pid or 0, signal.SIGTERM)
            if job.wait_until(lambda: not job.running(), exit_timeout):
                seconds_to_exit = time.monotonic() - signalled
    finally:
        exit_codes = job.close()
    saved = {rank: note[1] if (note := job.first(rank, "saved")) else None for rank in range(WORLD)}
    errors = {rank: note[1] for rank in range(WORLD) if (note := job.first(rank, "error"))}
    return {
        "mode": task["mode"],
        "victim": "all" if signal_all else victim,
        "delay_seconds": round(delay, 3),
        "saved_steps": saved,
        "agreed": len(set(saved.values())) == 1 and None not in saved.values(),
        "all_exited": seconds_to_exit is not None,
        "exit_codes": exit_codes,
        "seconds_to_exit": None if seconds_to_exit is None else round(seconds_to_exit, 3),
        "committed_step": _latest_step(task["root"]),
        "errors": errors,
    }


def _latest_step(root: str) -> int | None:
    from flyte_checkpoint.distributed import DistributedCheckpointManager

    return DistributedCheckpointManager(root).latest_step()


def run(
    trials: int,
    *,
    mode: str = "agreed",
    seed: int | None = None,
    step_ms: float = 10.0,
    max_delay: float = 2.0,
    grace_seconds: float = 30.0,
    pg_timeout: float = 20.0,
    base: str | None = None,
    signal_all: bool = False,
) -> list[dict[str, Any]]:
    """``trials`` runs of 4 ranks, each with a SIGTERM on a random rank at a random instant.

    ``mode="agreed"`` stops with ``reached_preemption``; ``"local"``, the baseline, on each
    rank's own notice. ``signal_all``: every rank gets the SIGTERM (as under ``torchrun``,
    whose agent forwards it), ``victim`` is then ``"all"``. Each dict: ``victim``,
    ``delay_seconds`` (signal after the first vote),
    ``saved_steps`` (by rank; ``None``: did not save), ``agreed``, ``all_exited`` (within the
    process-group timeout plus 10 s), ``exit_codes``, ``seconds_to_exit``, ``committed_step``,
    ``errors``.
    """
    if mode not in ("agreed", "local"):
        raise ValueError(f'mode must be "agreed" or "local", not {mode!r}')
    chooser = random.Random(seed)
    scratch = base or tempfile.mkdtemp(prefix="preemption-ranks-")
    results = []
    try:
        for trial in range(trials):
            task = {
                "program": "train",
                "mode": mode,
                "root": str(Path(scratch) / f"{mode}-{trial}"),
                "step_seconds": step_ms / 1000,
                "max_steps": int((max_delay + 30) / (step_ms / 1000)),
                "grace_seconds": grace_seconds,
                "pg_timeout": pg_timeout,
            }
            results.append({"trial": trial, **_trial(task, chooser, max_delay, pg_timeout + 10, signal_all)})
    finally:
        if base is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def vote_cost(*, world: int = WORLD, calls: int = 1000, repeats: int = 3) -> dict[str, float]:
    """Microseconds per ``reached_preemption`` call on ``world`` gloo ranks (median of ``repeats``),
    and per bare all-reduce of three float64 values, measured in the same run."""
    scratch = tempfile.mkdtemp(prefix="preemption-votes-")
    task = {"program": "measure_votes", "root": scratch, "calls": calls, "repeats": repeats, "pg_timeout": 60}
    job = _Job(task, world)
    try:
        job.wait_until(lambda: job.first(0, "cost") or not job.running(), STARTUP_TIMEOUT)
    finally:
        job.close()
        shutil.rmtree(scratch, ignore_errors=True)
    cost = job.first(0, "cost")
    if cost is None:
        raise RuntimeError(f"the vote measurement failed: {job.notes}")
    return {"reached_preemption_us": round(cost[1], 1), "bare_all_reduce_us": round(cost[2], 1)}


def _victim(victim: int | str) -> str:
    return "all ranks" if victim == "all" else f"rank {victim}"


def format_table(results: list[dict[str, Any]]) -> str:
    header = f"{'trial':>5} {'mode':>6} {'SIGTERM to':>10} {'after s':>7}  {'saved step by rank':<22}"
    header += f" {'all exited':>10} {'statuses':<17} {'exit s':>6} {'committed':>9}"
    lines = [header]
    for result in results:
        steps = " ".join("-" if step is None else str(step) for step in result["saved_steps"].values())
        codes = " ".join(str(code) for code in result["exit_codes"].values())
        exit_seconds = "-" if result["seconds_to_exit"] is None else f"{result['seconds_to_exit']:.2f}"
        committed = "-" if result["committed_step"] is None else str(result["committed_step"])
        lines.append(
            f"{result['trial']:>5} {result['mode']:>6} {_victim(result['victim']):>10} "
            f"{result['delay_seconds']:>7.2f}  {steps:<22} {'yes' if result['all_exited'] else 'NO':>10} "
            f"{codes:<17} {exit_seconds:>6} {committed:>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5, help="agreed-stop trials (default 5)")
    parser.add_argument(
        "--local", type=int, nargs="?", const=1, default=0, help="baseline trials (default 1)"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of the victims and instants")
    parser.add_argument(
        "--signal-all", action="store_true", help="SIGTERM every rank at once, as torchrun forwards it"
    )
    parser.add_argument("--step-ms", type=float, default=10.0, help="work per training step (default 10)")
    parser.add_argument("--max-delay", type=float, default=2.0, help="latest signal, s after the first vote")
    parser.add_argument("--pg-timeout", type=float, default=20.0, help="process-group timeout, s")
    parser.add_argument("--vote-calls", type=int, default=1000, help="calls per vote-cost measurement")
    args = parser.parse_args(argv)
    cost = vote_cost(calls=args.vote_calls)
    print(
        f"reached_preemption, gloo, {WORLD} ranks on this machine: {cost['reached_preemption_us']:.0f} us "
        f"per call (a bare all-reduce of 3 float64: {cost['bare_all_reduce_us']:.0f} us)",
        flush=True,
    )
    common: dict[str, Any] = {
        "signal_all": args.signal_all,
        "seed": args.seed,
        "step_ms": args.step_ms,
        "max_delay": args.max_delay,
        "pg_timeout": args.pg_timeout,
    }
    results = run(args.trials, **common)
    if args.local:
        local = run(args.local, mode="local", **common)
        results += [{**result, "trial": len(results) + index} for index, result in enumerate(local)]
    print(format_table(results))
    for result in results:
        for rank, text in result["errors"].items():
            print(f"trial {result['trial']} rank {rank}: {text.strip().splitlines()[-1]}")
    agreed = [result for result in results if result["mode"] == "agreed"]
    return 0 if all(result["agreed"] and result["all_exited"] for result in agreed) else 1


if __name__ == "__main__":
    sys.exit(main())
