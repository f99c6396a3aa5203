"""Programs the signal tests run as real processes: ``python -m tests.faults.signals.programs NAME ...``.

Each prints ``ready`` (flushed) once it is about to start the work a signal should interrupt,
so the parent can aim its signal; storage options come as JSON in ``$SIGNAL_TEST_STORAGE_OPTIONS``.

``save-dir SOURCE DEST [--exit-on-sigterm]``
    a blocking directory save; with ``--exit-on-sigterm`` a SIGTERM handler calls ``sys.exit(143)``
    (the usual preemption pattern).
``background-then-end SIZE_MIB DEST [--interrupt-after SECONDS]``
    start a background save of SIZE_MIB random bytes and let the script end, or send itself a
    SIGINT (as Ctrl-C does) after SECONDS while the upload runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flyte_checkpoint import Checkpoint

STORAGE_OPTIONS_ENV = "SIGNAL_TEST_STORAGE_OPTIONS"


def storage_options() -> dict[str, Any] | None:
    raw = os.environ.get(STORAGE_OPTIONS_ENV)
    return json.loads(raw) if raw else None


def save_dir(source: Path, dest: str, exit_on_sigterm: bool) -> None:
    if exit_on_sigterm:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    helper = Checkpoint(dest, storage_options=storage_options())
    print("ready", flush=True)
    helper.save_sync(source)
    print("committed", flush=True)


def background_then_end(size_mib: int, dest: str, interrupt_after: float | None) -> None:
    helper = Checkpoint(dest, storage_options=storage_options())
    data = os.urandom(size_mib << 20)
    helper.save_sync(data, background=True)
    print("ready", flush=True)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)  # the KeyboardInterrupt ends this


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("flyte_checkpoint").setLevel(logging.DEBUG)
    # As in an interactive shell: a job started in the background inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save-dir")
    save.add_argument("source", type=Path)
    save.add_argument("dest")
    save.add_argument("--exit-on-sigterm", action="store_true")
    background = commands.add_parser("background-then-end")
    background.add_argument("size_mib", type=int)
    background.add_argument("dest")
    background.add_argument("--interrupt-after", type=float)
    args = parser.parse_args(argv)
    if args.command == "save-dir":
        save_dir(args.source, args.dest, args.exit_on_sigterm)
    else:
        background_then_end(args.size_mib, args.dest, args.interrupt_after)


if __name__ == "__main__":
    main()
