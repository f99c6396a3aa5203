"""DCP storage layers compared: ours (``flyte_checkpoint.distributed``) against DCP's own.

Run from the repository root with the project's venv::

    python benchmarks/dcp.py                 # local disk: ours vs FileSystemWriter, 256 MiB on 4 ranks
    python benchmarks/dcp.py --s3            # also S3 (the test suite's moto): ours vs FsspecWriter
    python benchmarks/dcp.py --kill-trials 8 # and the kill-test outcome table, local disk

Every figure comes from one process group of 4 gloo ranks saving the same state: 16 float32
tensors sharded on dim 0 (``DTensor``), ``--mib`` in total. Measured per layer, over
``--repeats`` runs each (median), after one unmeasured save: the blocking ``dcp.save`` over the
existing checkpoint, the time ``dcp.async_save`` (thread mode) blocks its caller and the time
until its upload completes, and ``dcp.load``. Times are wall clock on rank 0 between barriers.
Locally both layers sync to disk (``FileSystemWriter``'s default ``sync_files=True``, our
``fsync`` storage option); "ours, no fsync" is our default (atomic, not power-loss durable).

Kill trials: over an existing checkpoint, a save of new values on 4 ranks; the parent SIGKILLs a
random rank at a random instant of it; then a fresh 4-rank load classifies the checkpoint as the
old values, the new ones, a mix (some tensors or shards old, some new) or unreadable.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
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
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks` is a package
from benchmarks.lib.data import DATA_ROOT
from benchmarks.lib.processes import free_port
from benchmarks.lib.report import add_json_out, describe_machine, write_json_out

REPO = Path(__file__).resolve().parents[1]
TENSORS = 16
COLUMNS = 1024
WORLD = 4


# --------------------------------------------------------------------------- what runs in each rank


def _state(world: int, rank: int, mib: int, value: float) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    rows = mib * (1 << 20) // 4 // COLUMNS // TENSORS
    local_rows = rows // world
    return {
        f"layer{index:02d}": DTensor.from_local(
            torch.full((local_rows, COLUMNS), value), mesh, [Shard(0)], run_check=False
        )
        for index in range(TENSORS)
    }


def _layer(kind: str, root: str, options: dict[str, Any] | None, reader: bool) -> Any:
    if kind.startswith("ours"):
        from flyte_checkpoint.distributed import CheckpointReader, CheckpointWriter

        opts = dict(options or {})
        if kind == "ours":  # local disk, synced like FileSystemWriter's default
            opts["fsync"] = True
        return (CheckpointReader if reader else CheckpointWriter)(root, storage_options=opts or None)
    if kind == "filesystem":
        from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter

        return FileSystemReader(root) if reader else FileSystemWriter(root)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return FsspecReader(root, **(options or {})) if reader else FsspecWriter(root, **(options or {}))


def _timed(step: Callable[[], Any]) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    step()
    dist.barrier()
    return time.perf_counter() - start


def measure(
    rank: int, world: int, task: dict[str, Any], say: Callable[[Any], None]
) -> dict[str, list[float]]:
    """Blocking save, async save (caller-blocked and total) and load times of one layer."""
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, async_save, save

    kind, root, options = task["layer"], task["root"], task.get("options")
    state = _state(world, rank, task["mib"], 1.0)
    save(state, storage_writer=_layer(kind, root, options, reader=False))  # a checkpoint to save over
    times: dict[str, list[float]] = {"save": [], "async_blocked": [], "async_total": [], "load": []}
    for _ in range(task["repeats"]):
        times["save"].append(_timed(lambda: save(state, storage_writer=_layer(kind, root, options, False))))
    for _ in range(task["repeats"]):
        import torch.distributed as dist

        dist.barrier()
        start = time.perf_counter()
        future = async_save(
            state,
            storage_writer=_layer(kind, root, options, False),
            async_checkpointer_type=AsyncCheckpointerType.THREAD,
        )
        blocked = time.perf_counter() - start
        result = future.result() if hasattr(future, "result") else future.upload_completion.result()
        del result
        total = time.perf_counter() - start
        dist.barrier()
        times["async_blocked"].append(blocked)
        times["async_total"].append(total)
    target = _state(world, rank, task["mib"], -1.0)
    for _ in range(task["repeats"]):
        times["load"].append(_timed(lambda: load(target, storage_reader=_layer(kind, root, options, True))))
    return times


def save_once(rank: int, world: int, task: dict[str, Any], say: Callable[[Any], None]) -> float:
    """Save the state of ``value``; tell the parent when the save starts (so it can aim a kill)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import save

    state = _state(world, rank, task["mib"], float(task["value"]))
    writer = _layer(task["layer"], task["root"], task.get("options"), reader=False)
    dist.barrier()
    if rank == 0:
        say("saving")
    start = time.perf_counter()
    save(state, storage_writer=writer)
    return time.perf_counter() - start


def classify(rank: int, world: int, task: dict[str, Any], say: Callable[[Any], None]) -> list[float] | str:
    """The distinct values this rank loaded (empty tensors never stay at -1), or why it could not."""
    from torch.distributed.checkpoint.state_dict_loader import load

    target = _state(world, rank, task["mib"], -1.0)
    try:
        load(target, storage_reader=_layer(task["layer"], task["root"], task.get("options"), reader=True))
    except BaseException as exc:
        return f"unreadable: {type(exc).__name__}"
    return sorted(
        {float(value) for tensor in target.values() for value in tensor.to_local().unique().tolist()}
    )


PROGRAMS: dict[str, Callable[[int, int, dict[str, Any], Callable[[Any], None]], Any]] = {
    "measure": measure,
    "save_once": save_once,
    "classify": classify,
}


def _rank_main(rank: int, world: int, port: int, task: dict[str, Any], answers: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
        result = PROGRAMS[task["program"]](rank, world, task, lambda note: answers.put((rank, "note", note)))
        answers.put((rank, "ok", result))
        dist.destroy_process_group()
    except BaseException:
        answers.put((rank, "error", traceback.format_exc()))


# --------------------------------------------------------------------------- the parent


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed.checkpoint", "s3fs"])
    return context


def launch(
    task: dict[str, Any], *, kill_window: float | None = None, chooser: random.Random | None = None
) -> dict[int, Any]:
    """Run ``task`` on 4 ranks; with ``kill_window``, SIGKILL a random rank that long (at most)
    after rank 0 says the save started. Returns each rank's result or error text."""
    context = _context()
    answers = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank_main, args=(rank, WORLD, port, task, answers)) for rank in range(WORLD)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + 600
    try:
        while len(results) < WORLD and time.monotonic() < deadline:
            try:
                rank, kind, value = answers.get(timeout=0.05)
            except queue.Empty:
                if all(not process.is_alive() for process in processes):
                    break
                continue
            if kind == "note" and kill_window is not None and chooser is not None:
                time.sleep(chooser.uniform(0, kill_window))
                victim = chooser.randrange(WORLD)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(processes[victim].pid or 0, signal.SIGKILL)
            elif kind == "ok":
                results[rank] = value
            elif kind == "error":
                results[rank] = RuntimeError(value)
    finally:
        for process in processes:
            process.join(timeout=max(0.0, min(30.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join()
        answers.close()
        answers.join_thread()
    return results


def _fail_on_errors(results: dict[int, Any], what: str) -> None:
    errors = [value for value in results.values() if isinstance(value, Exception)]
    if errors or len(results) != WORLD:
        raise SystemExit(f"{what} failed: {errors[0] if errors else results}")


def run_measurements(
    layers: list[str], base: str, options: dict[str, Any] | None, mib: int, repeats: int
) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for layer in layers:
        root = f"{base}/{layer}"
        results = launch(
            {
                "program": "measure",
                "layer": layer,
                "root": root,
                "options": options,
                "mib": mib,
                "repeats": repeats,
            }
        )
        _fail_on_errors(results, f"measuring {layer}")
        table[layer] = {name: statistics.median(values) for name, values in results[0].items()}
        print(
            f"  {layer:18s} " + "  ".join(f"{name} {value:6.3f} s" for name, value in table[layer].items()),
            flush=True,
        )
    return table


def print_ratios(table: dict[str, dict[str, float]], ours: str, theirs: str) -> None:
    for name in ("save", "async_blocked", "async_total", "load"):
        print(f"  {name:14s} ours/theirs = {table[ours][name] / table[theirs][name]:.2f}", flush=True)


def run_kill_trials(layer: str, base: str, trials: int, mib: int, seed: int) -> Counter[str]:
    chooser = random.Random(seed)
    root = f"{base}/kill-{layer}"
    _fail_on_errors(
        launch({"program": "save_once", "layer": layer, "root": root, "mib": mib, "value": 1}), "first save"
    )
    start = time.perf_counter()
    _fail_on_errors(
        launch({"program": "save_once", "layer": layer, "root": root, "mib": mib, "value": 2}), "timing save"
    )
    window = time.perf_counter() - start
    old = 2.0
    outcomes: Counter[str] = Counter()
    for trial in range(trials):
        new = float(3 + trial)
        launch(
            {"program": "save_once", "layer": layer, "root": root, "mib": mib, "value": new},
            kill_window=window,
            chooser=chooser,
        )
        loaded = launch({"program": "classify", "layer": layer, "root": root, "mib": mib})
        values = {value for result in loaded.values() if isinstance(result, list) for value in result}
        if any(isinstance(result, str | Exception) for result in loaded.values()) or len(loaded) != WORLD:
            outcome = "unreadable"
        elif values == {old}:
            outcome = "old"
        elif values == {new}:
            outcome = "new"
        else:
            outcome = "mixed"
        outcomes[outcome] += 1
        if outcome in ("old", "new"):
            old = old if outcome == "old" else new
        else:
            # Start the next trial from a good checkpoint again.
            _fail_on_errors(
                launch({"program": "save_once", "layer": layer, "root": root, "mib": mib, "value": 2}),
                "repair save",
            )
            old = 2.0
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=256, help="state size, all ranks together (default 256)")
    parser.add_argument("--repeats", type=int, default=2, help="measured runs per figure (median)")
    parser.add_argument("--s3", action="store_true", help="also compare on S3 (moto) against FsspecWriter")
    parser.add_argument("--s3-mib", type=int, default=256)
    parser.add_argument("--kill-trials", type=int, default=0, help="kill trials per layer, local disk")
    parser.add_argument("--kill-mib", type=int, default=64)
    parser.add_argument("--dir", help="where local checkpoints go (default: a temporary directory)")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "machine": describe_machine(DATA_ROOT),
        "load_average": {"start": os.getloadavg()[0]},
        "config": {
            "world": WORLD,
            "mib": args.mib,
            "repeats": args.repeats,
            "s3_mib": args.s3_mib if args.s3 else None,
            "kill_trials": args.kill_trials,
            "kill_mib": args.kill_mib,
        },
        "local": None,
        "s3": None,
        "kill_trials": None,
    }
    base = args.dir or tempfile.mkdtemp(prefix="dcp-bench-")
    try:
        print(f"local disk ({base}), {args.mib} MiB on {WORLD} ranks, median of {args.repeats}:", flush=True)
        local = run_measurements(["ours", "filesystem", "ours-nofsync"], base, None, args.mib, args.repeats)
        report["local"] = local
        print("ours (fsync) vs FileSystemWriter (sync_files=True):")
        print_ratios(local, "ours", "filesystem")
        if args.s3:
            servers = importlib.import_module("tests.storage_servers")
            with servers.start_moto() as server:
                bucket = servers.create_bucket(server, "dcp-bench")
                print(f"S3 (moto), {args.s3_mib} MiB on {WORLD} ranks, median of {args.repeats}:", flush=True)
                remote = run_measurements(
                    ["ours-s3", "fsspec"], f"s3://{bucket}", server.storage_options, args.s3_mib, args.repeats
                )
                report["s3"] = remote
                print("ours vs FsspecWriter:")
                print_ratios(remote, "ours-s3", "fsspec")
        if args.kill_trials:
            print(f"kill trials, local disk, {args.kill_mib} MiB, {args.kill_trials} per layer:", flush=True)
            report["kill_trials"] = {}
            for layer in ("ours", "filesystem"):
                outcomes = run_kill_trials(layer, base, args.kill_trials, args.kill_mib, seed=7)
                report["kill_trials"][layer] = {
                    name: outcomes[name] for name in ("old", "new", "mixed", "unreadable")
                }
                print(
                    f"  {layer:12s} "
                    + "  ".join(f"{name} {outcomes[name]}" for name in ("old", "new", "mixed", "unreadable")),
                    flush=True,
                )
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    report["load_average"]["end"] = os.getloadavg()[0]
    write_json_out(args.json_out, "benchmarks/dcp.py", argv, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
