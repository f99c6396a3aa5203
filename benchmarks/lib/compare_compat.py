"""Compatibility checks: our objects stay standard, and the reference's load with us (and ours with it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from benchmarks._worker import tree_digest
from benchmarks.lib.data import (
    Dataset,
    remove,
)
from benchmarks.lib.operations import ensure_object, worker_spec
from benchmarks.lib.report import log
from benchmarks.lib.workers import (
    Runner,
    Storage,
    WorkerError,
    object_name,
)


def check_compat(
    runner: Runner, storage: Storage, datasets: dict[str, Dataset], impls: list[str]
) -> list[dict[str, Any]]:
    checks: list[dict[str, Any]] = []
    directory = datasets.get("dir")
    if directory is not None and storage.name == "local":
        ensure_object(runner, storage, "ours", "dir", directory)
        ours_object = Path(storage.uri("ours", object_name("dir")))
        extract = runner.run_dir / "compat-extract"
        remove(extract)
        extract.mkdir()
        done = subprocess.run(
            ["tar", "-xzf", str(ours_object), "-C", str(extract)], capture_output=True, text=True
        )
        ok = done.returncode == 0 and tree_digest(extract) == directory.digest
        checks.append(
            {
                "name": "tar -xzf reads our directory object (same tree)",
                "ok": ok,
                "detail": done.stderr.strip()[-300:] if done.returncode else "",
            }
        )
        remove(extract)
    if "reference" in impls:
        for kind in ("dir", "file"):
            data = datasets.get(kind)
            if data is None:
                continue
            for writer, reader in (("ours", "reference"), ("reference", "ours")):
                name = f"{reader} loads {writer}'s {kind} object ({storage.name})"
                try:
                    ensure_object(runner, storage, writer, kind, data)
                    spec = worker_spec("load", kind, "sync", data, storage, writer)
                    spec["dest"] = storage.uri(reader, f"unused-{kind}")
                    spec["verify"] = True
                    result = runner.worker(reader, spec, storage)
                    ok = result.get("digest") == data.digest
                    detail = "" if ok else "restored content differs"
                except WorkerError as exc:
                    ok, detail = False, str(exc).splitlines()[0]
                checks.append({"name": name, "ok": ok, "detail": detail})
    for check in checks:
        log(f"compat: {check['name']}: {'ok' if check['ok'] else 'FAILED ' + check['detail']}")
    return checks
