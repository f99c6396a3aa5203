"""A user's script that runs a Flyte task in the SDK's local mode, as a real process to SIGTERM.

``python -m tests.integrations.flyte_local_run RAW_DATA [--retries N] [--async] [--unhandled]
[--entry runcontext|run|aio] [--uncaught]`` installs the plugin (5 s grace period) and runs
``count_until_preempted`` (``--async``: its ``async def`` twin) with ``signals=1`` in local mode,
with its raw data (so its checkpoint) under RAW_DATA and ``retries=N``: attempt 0 prints ``ready``
and waits for the parent's SIGTERM. ``--entry`` is how the run starts: ``runcontext``
(``flyte.with_runcontext(mode="local").run``), ``run`` (``flyte.run``, local for want of a
client; its raw data under ``/tmp/flyte/raw_data``, removed after it) or ``aio``
(``await flyte.with_runcontext(mode="local").run.aio`` in ``asyncio.run``).
The last line is JSON: the task's result, or the ``Preempted`` the run ended with (caught to be
printed; ``--uncaught``: left to end the process with its status), and whether the SIGTERM
handler from before the run is back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import flyte

import flyte_checkpoint.integrations.flyte as flyte_plugin
from flyte_checkpoint.errors import Preempted
from tests.integrations.flyte_tasks import (
    SDK_LOCAL_METADATA,
    count_until_preempted,
    count_until_preempted_async,
)
from tests.runner_programs import GRACE_SECONDS

SDK_LOCAL_RAW_DATA = SDK_LOCAL_METADATA.parent / "raw_data"
"""Where ``flyte.run`` in local mode puts a run's raw data, for want of a ``raw_data_path``."""


async def _awaited(awaitable: Awaitable[flyte.remote.Run]) -> flyte.remote.Run:
    return await awaitable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw_data")
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--unhandled", action="store_true")
    parser.add_argument("--entry", choices=["runcontext", "run", "aio"], default="runcontext")
    parser.add_argument("--uncaught", action="store_true")
    args = parser.parse_args()
    flyte_plugin.install(grace_seconds=GRACE_SECONDS)
    task: Any = (count_until_preempted_async if args.use_async else count_until_preempted).override(
        retries=args.retries
    )
    name = f"fc-{uuid.uuid4().hex[:16]}"
    before = signal.getsignal(signal.SIGTERM)
    inputs = {"signals": 1, "unhandled": args.unhandled}
    outcome: dict[str, Any] = {}
    try:
        if args.entry == "run":
            run = flyte.run(task, **inputs)  # local: no client was configured
            name = Path(run.url).name  # its metadata and raw data are under /tmp/flyte/*/name
            shutil.rmtree(SDK_LOCAL_RAW_DATA / name, ignore_errors=True)
        else:
            runner = flyte.with_runcontext(mode="local", name=name, raw_data_path=args.raw_data)
            if args.entry == "aio":
                run = asyncio.run(_awaited(runner.run.aio(task, **inputs)))
            else:
                run = runner.run(task, **inputs)
        outcome["result"] = run.outputs()[0]
    except Preempted as preempted:
        if args.uncaught:
            raise
        outcome["preempted"] = {"saved": preempted.saved, "code": preempted.code}
    finally:
        shutil.rmtree(SDK_LOCAL_METADATA / name, ignore_errors=True)
    outcome["handler_restored"] = signal.getsignal(signal.SIGTERM) is before
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
