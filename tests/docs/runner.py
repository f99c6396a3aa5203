"""Runs documentation programs in this one process, in order, each in a fresh namespace and a
fresh working directory: ``python runner.py PROGRAMS.json RESULTS.json``.

PROGRAMS.json is a list of ``{"name", "parts", "cwd"}``; RESULTS.json gets one JSON line per
program as it finishes, ``{"name": ..., "error": null}`` for a program that ran and
``{"name": ..., "error": traceback}`` for one that raised (so a program that ends the process
still leaves the results of those before it). One process for all of them:
starting an interpreter (and importing torch) per block would cost most of the time budget.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, TextIO


def run(programs: list[dict[str, Any]], results: TextIO) -> None:
    for program in programs:
        os.chdir(program["cwd"])
        namespace: dict[str, Any] = {"__name__": "__main__"}
        error: str | None = None
        started = time.monotonic()
        try:
            for index, part in enumerate(program["parts"]):
                exec(compile(part, f"{program['name']} (part {index})", "exec"), namespace)
        except BaseException:
            error = traceback.format_exc()
        seconds = round(time.monotonic() - started, 2)
        results.write(json.dumps({"name": program["name"], "error": error, "seconds": seconds}) + "\n")
        results.flush()


if __name__ == "__main__":
    with open(sys.argv[1]) as source:
        loaded = json.load(source)
    with open(sys.argv[2], "w") as target:
        run(loaded, target)
