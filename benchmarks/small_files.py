"""Many small files: our directory save and load against ``tar -czf`` / ``tar -xzf``, same run.

Generates ``--files`` tiny files (default 100,000; 100-byte-ish, ``--per-dir`` per directory) in
``benchmarks/.data/small-<files>/`` (kept between runs), then, each in a fresh process:

* ``Checkpoint(dest).save_sync(tree)`` to a local file, and ``tar -czf`` of the same tree;
* ``Checkpoint(dest, src).load_sync()`` of that object, and ``tar -xzf`` of tar's archive.

Prints the wall times, our time as a ratio of tar's, and our peak RSS (and the RSS of the same
process before the operation, i.e. interpreter + imports). Targets (issue 13): save within 2x
``tar -czf`` and peak RSS under 100 MiB at 300,000 files; load stays flat.

    .venv/bin/python benchmarks/small_files.py --files 300000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MIB = 1 << 20
SAVE_RATIO_TARGET = 2.0
PEAK_RSS_TARGET_MIB = 100.0

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from flyte_checkpoint import Checkpoint
op, dest, tree = sys.argv[2], sys.argv[3], sys.argv[4]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
if op == "save":
    Checkpoint(dest).save_sync(__import__("pathlib").Path(tree))
else:
    checkpoint = Checkpoint(tree, dest)
    assert checkpoint.load_sync() is not None
    checkpoint_path = str(checkpoint.path)
wall = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"wall_s": wall, "peak_rss_mib": peak / 1024, "rss_before_mib": before / 1024}))
"""


def make_tree(root: Path, files: int, per_dir: int) -> Path:
    """A tree of ``files`` small files (kept between runs: creating 300k files takes a while)."""
    tree = root / f"small-{files}-{per_dir}"
    done = tree / ".complete"
    if done.exists():
        return tree / "data"
    shutil.rmtree(tree, ignore_errors=True)
    data = tree / "data"
    for index in range(files):
        directory = data / f"d{index // per_dir:05d}"
        if index % per_dir == 0:
            directory.mkdir(parents=True)
        (directory / f"f{index:07d}.txt").write_bytes(f"file {index}\n".encode() * 8)
    done.touch()
    return data


def run_ours(op: str, dest: Path, tree: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(REPO), op, str(dest), str(tree)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_tar(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(["tar", *args], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--per-dir", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1, help="runs of each; the best is reported")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()

    data_root = HERE / ".data"
    data_root.mkdir(exist_ok=True)
    tree = make_tree(data_root, options.files, options.per_dir)
    os.sync()
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=data_root, prefix="small-run-") as scratch:
        work = Path(scratch)
        for _ in range(options.runs):
            for name in ("ours.tar.gz", "tar.tar.gz"):
                (work / name).unlink(missing_ok=True)
            tar_save = run_tar(["-czf", str(work / "tar.tar.gz"), "-C", str(tree), "."])
            save = run_ours("save", work / "ours.tar.gz", tree)
            restored = work / "tar-restored"
            shutil.rmtree(restored, ignore_errors=True)
            restored.mkdir()
            tar_load = run_tar(["-xzf", str(work / "tar.tar.gz"), "-C", str(restored)])
            shutil.rmtree(restored)
            load = run_ours("load", work / "ours.tar.gz", work / "workspace")
            shutil.rmtree(work / "workspace", ignore_errors=True)
            figures = {
                "save": {**save, "tar_s": tar_save, "ratio": save["wall_s"] / tar_save},
                "load": {**load, "tar_s": tar_load, "ratio": load["wall_s"] / tar_load},
            }
            for op, values in figures.items():
                if op not in best or values["wall_s"] < best[op]["wall_s"]:
                    best[op] = values
        object_mib = (work / "ours.tar.gz").stat().st_size / MIB

    if options.json:
        print(json.dumps({"files": options.files, "object_mib": object_mib, **best}))
        return
    print(
        f"{options.files} files of ~100 bytes, {options.per_dir} per directory; object {object_mib:.1f} MiB"
    )
    for op, tar_name in (("save", "tar -czf"), ("load", "tar -xzf")):
        values = best[op]
        print(
            f"{op}: ours {values['wall_s']:.2f} s, {tar_name} {values['tar_s']:.2f} s, "
            f"ratio {values['ratio']:.2f}x; peak RSS {values['peak_rss_mib']:.0f} MiB "
            f"(before the {op}: {values['rss_before_mib']:.0f} MiB)"
        )
    save = best["save"]
    print(
        f"targets: save <= {SAVE_RATIO_TARGET:.0f}x tar -czf: "
        f"{'met' if save['ratio'] <= SAVE_RATIO_TARGET else 'NOT met'}; save peak RSS < "
        f"{PEAK_RSS_TARGET_MIB:.0f} MiB: {'met' if save['peak_rss_mib'] < PEAK_RSS_TARGET_MIB else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
