"""Incremental saves SIGKILLed at random instants, two processes saving on one key at once and a
third collecting garbage all the while (no grace): every load afterwards gives one whole saved
version, so no chunk a live manifest needs was ever removed.

Half the files change every version and half never do, so saves both upload new chunks and
find stored ones. A save reusing a chunk a collection condemned uploads it again, so the
two-phase collection (see :mod:`flyte_checkpoint.incremental.gc`) never deletes it under it.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path

from flyte_checkpoint import Checkpoint

FILES = 6
TRIALS = 6


def _version(n: int) -> dict[str, bytes]:
    files = {f"f{i}": (b"%d-%d;" % (n if i % 2 else 0, i)) * (3000 + 700 * i) for i in range(FILES)}
    return {**files, "stamp": b"%d" % n}


def _save_forever(dest: str, source: str, first: int) -> None:
    with Checkpoint(dest) as helper:
        for n in range(first, first + 1_000_000):
            for name, data in _version(n).items():
                Path(source, name).write_bytes(data)
            helper.save_sync(source, incremental=True)


def _collect_forever(dest: str) -> None:
    with Checkpoint(dest) as helper:
        while True:
            helper.collect_garbage_sync(grace=datetime.timedelta(0))


def _started(target: Callable[..., None], *args: object) -> BaseProcess:
    process = multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def _kill(process: BaseProcess) -> None:
    if process.pid is not None:
        os.kill(process.pid, signal.SIGKILL)
    process.join()


def _loaded(dest: Path, workspace: Path) -> dict[str, bytes] | None:
    with Checkpoint(workspace, checkpoint_src=dest) as helper:
        restored = helper.load_sync()
        return None if restored is None else {path.name: path.read_bytes() for path in restored.iterdir()}


def test_killed_concurrent_incremental_saves_under_garbage_collection_leave_a_whole_version(
    tmp_path: Path,
) -> None:
    dest = tmp_path / "store" / "ckpt"
    sources = [tmp_path / "one", tmp_path / "two"]
    for source in sources:
        source.mkdir()
    rng = random.Random(31)
    collector = _started(_collect_forever, str(dest))
    try:
        for trial in range(TRIALS):
            savers = [
                _started(_save_forever, str(dest), str(source), 1000 * (2 * trial + number))
                for number, source in enumerate(sources)
            ]
            time.sleep(rng.uniform(0.05, 0.4))
            for saver in savers:
                _kill(saver)
            loaded = _loaded(dest, tmp_path / "workspace")
            if loaded is not None:
                assert loaded == _version(int(loaded["stamp"])), f"trial {trial}: a mixed state"
    finally:
        _kill(collector)
    last = _started(_collect_forever, str(dest))
    time.sleep(rng.uniform(0.05, 0.2))
    _kill(last)  # a collection killed mid-way removed nothing live either
    loaded = _loaded(dest, tmp_path / "workspace")
    assert loaded is not None
    assert loaded == _version(int(loaded["stamp"]))
