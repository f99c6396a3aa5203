"""Incremental directory saves against plain ones: a directory that gains a checkpoint each save.

Both kinds run in this one process on the same data: ``--saves`` saves (default 10) of a
directory that gains a ``checkpoint-<n>/model.bin`` of ``--mib`` MiB (default 32, random, so
incompressible) before each, to a local destination (``--dest`` for another URI, with
``--storage-option key=value`` as needed). A plain save (``save_sync(dir)``) writes the whole
directory as one ``.tar.gz`` each time; an incremental one (``save_sync(dir, incremental=True)``)
uploads only the chunks the store lacks and commits a manifest.

Printed for each kind: the 1st and the last save's wall time and their ratio, the bytes each
moved in all (what the store received), and the bytes stored at the end, as a multiple of the
final directory's size. Targets (issue 31): the 10th incremental save within 2x the 1st; bytes
stored within 1.3x the final directory.

    .venv/bin/python benchmarks/incremental.py            # --smoke: 1 MiB, 3 saves
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.incremental import chunk_store_for
from flyte_checkpoint.storage import backend_for

MIB = 1 << 20
LAST_OVER_FIRST_TARGET = 2.0
STORED_OVER_DIRECTORY_TARGET = 1.3


def stored_bytes(prefix: str, options: dict[str, Any]) -> int:
    """Bytes of every object below ``prefix`` (the object and, for incremental saves, its chunks)."""
    backend = backend_for(prefix, options)
    infos = (backend.info(uri) for uri in backend.list_prefix(prefix))
    return sum(info.size for info in infos if info is not None)


def run(kind: str, pool: list[Path], dest: str, options: dict[str, Any], work: Path) -> dict[str, Any]:
    """``len(pool)`` saves of a directory gaining one file of ``pool`` each time."""
    source = work / f"output-{kind}"
    source.mkdir()
    incremental = kind == "incremental"
    walls: list[float] = []
    moved = 0
    backend = backend_for(dest, options)
    with Checkpoint(dest, storage_options=options) as checkpoint:
        for step, data in enumerate(pool):
            (source / f"checkpoint-{step}").mkdir()
            os.link(data, source / f"checkpoint-{step}" / "model.bin")
            before = stored_bytes(chunk_store_for(dest, run_name=None, action_name=None), options)
            started = time.perf_counter()
            checkpoint.save_sync(source, incremental=incremental)
            walls.append(time.perf_counter() - started)
            after = stored_bytes(chunk_store_for(dest, run_name=None, action_name=None), options)
            info = backend.info(dest)
            moved += (info.size if info else 0) + after - before
    directory = sum(path.stat().st_size for path in source.rglob("*") if path.is_file())
    info = backend.info(dest)
    stored = (info.size if info else 0) + stored_bytes(
        chunk_store_for(dest, run_name=None, action_name=None), options
    )
    shutil.rmtree(source)
    return {
        "kind": kind,
        "walls_s": walls,
        "last_over_first": walls[-1] / walls[0],
        "directory_bytes": directory,
        "moved_bytes": moved,
        "stored_bytes": stored,
        "stored_over_directory": stored / directory,
        "moved_over_directory": moved / directory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mib", type=int, default=32, help="MiB each save adds")
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--dest", help="base URI of the destinations (default: a local temp dir)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--smoke", action="store_true", help="1 MiB, 3 saves")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()
    if options.smoke:
        options.mib, options.saves = 1, 3
    storage = dict(option.split("=", 1) for option in options.storage_option)
    with tempfile.TemporaryDirectory(prefix="incremental-bench-") as scratch:
        work = Path(scratch)
        pool = []
        for step in range(options.saves):
            path = work / f"pool-{step}.bin"
            path.write_bytes(os.urandom(options.mib * MIB))
            pool.append(path)
        base = options.dest.rstrip("/") if options.dest else str(work / "store")
        run_id = uuid.uuid4().hex[:8]
        results = [
            run(kind, pool, f"{base}/{run_id}/{kind}/checkpoint", storage, work)
            for kind in ("plain", "incremental")
        ]
    if options.json:
        print(json.dumps({"mib": options.mib, "saves": options.saves, "results": results}))
        return
    print(f"{options.saves} saves of a directory gaining {options.mib} MiB (random) each time")
    for result in results:
        walls = result["walls_s"]
        print(
            f"{result['kind']:>11}: 1st {walls[0]:.3f} s, last {walls[-1]:.3f} s "
            f"(last/1st {result['last_over_first']:.2f}x); moved {result['moved_bytes'] / MIB:.0f} MiB "
            f"({result['moved_over_directory']:.2f}x the final directory), stored "
            f"{result['stored_bytes'] / MIB:.0f} MiB ({result['stored_over_directory']:.2f}x)"
        )
    incremental = results[1]
    last_ok = incremental["last_over_first"] <= LAST_OVER_FIRST_TARGET
    stored_ok = incremental["stored_over_directory"] <= STORED_OVER_DIRECTORY_TARGET
    print(
        f"targets: last incremental save <= {LAST_OVER_FIRST_TARGET:.0f}x the 1st: "
        f"{'met' if last_ok else 'NOT met'}; bytes stored <= {STORED_OVER_DIRECTORY_TARGET}x the "
        f"final directory: {'met' if stored_ok else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
