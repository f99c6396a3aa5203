"""What every benchmark reports: progress lines on stderr, tables, the machine it ran on, and the
report written to a file (``--json-out PATH``), the input of ``charts.py``.

The file holds the same report as ``--json`` prints, plus what produced it: the script, its
arguments and the time of the run, so a committed result says how to reproduce it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO


def add_json_out(parser: argparse.ArgumentParser) -> None:
    """Add ``--json-out PATH`` to a benchmark's arguments."""
    parser.add_argument(
        "--json-out",
        type=Path,
        metavar="PATH",
        help="also write the full results as JSON to PATH (with the command line and the time)",
    )


def write_json_out(
    path: Path | None, script: str, argv: Sequence[str] | None, report: dict[str, Any]
) -> None:
    """Write ``report`` to ``path`` (nothing when it is None), recording how it was produced."""
    if path is None:
        return
    arguments = list(sys.argv[1:] if argv is None else argv)
    produced = {
        "benchmark": script,
        "arguments": arguments,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"produced": produced, **report}, indent=2) + "\n")


def log(message: str) -> None:
    """A progress line on stderr (stdout is the report's)."""
    print(message, file=sys.stderr, flush=True)


def print_table(rows: list[list[str]], header: list[str], out: TextIO) -> None:
    """``rows`` under ``header`` as a Markdown table on ``out`` (nothing when there are no rows)."""
    if not rows:
        return
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + " |", file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for row in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) + " |", file=out)


def describe_machine(data_root: Path) -> dict[str, Any]:
    """The CPU, memory, kernel, Python and the filesystem of ``data_root``, for a report's header."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / (1 << 20):.1f} GiB RAM"
                break
    filesystem = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["df", "-hT", str(data_root)], capture_output=True, text=True, timeout=10, check=True
        )
        last = done.stdout.strip().splitlines()[-1].split()
        filesystem = f"{last[0]} ({last[1]}, {last[2]} total)"
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "memory": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "filesystem": filesystem,
    }
