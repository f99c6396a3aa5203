"""A benchmark's report written to a file (``--json-out PATH``), the input of ``charts.py``.

The file holds the same report as ``--json`` prints, plus what produced it: the script, its
arguments and the time of the run, so a committed result says how to reproduce it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
