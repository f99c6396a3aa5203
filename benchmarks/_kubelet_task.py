"""The task `benchmarks/kubelet.py` runs: the README's preemption loop, written as a user would.

Its state is a directory (``weights.bin``, a deterministic function of the step, and
``meta.json`` with the step and the weights' digest), saved in the background every ``every``
steps and once more, blocking, after a notice. Optional features make it harder to preempt:
``inplace`` rewrites ``weights.bin`` in place (``torch.save(state, same_path)`` does), ``fork``
keeps a DataLoader's two fork workers alive, ``cpu`` spends each step in C calls on the main
thread. Every event goes to a JSON-lines journal the supervisor judges the run by.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from flyte_checkpoint import current_checkpoint


def weights_for(step: int, mib: int) -> bytes:
    """The weights after ``step`` steps: deterministic, incompressible."""
    return random.Random(step).randbytes(mib << 20)


def _log(journal: str, **event: Any) -> None:
    event.update(t=time.time(), pid=os.getpid(), attempt=int(os.environ.get("FLYTE_ATTEMPT_NUMBER", "0")))
    with open(journal, "a") as file:
        file.write(json.dumps(event) + "\n")


def _data_loader() -> Any:
    """A DataLoader with two fork workers alive across steps (torch imported only for this)."""
    import torch.utils.data

    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.arange(64)),
        batch_size=8,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
    )


def _restored_step(restored: Path | None, mib: int, journal: str) -> int:
    if restored is None:
        _log(journal, event="fresh")
        return 0
    meta = json.loads((restored / "meta.json").read_text())
    data = (restored / "weights.bin").read_bytes()
    intact = hashlib.sha256(data).hexdigest() == meta["digest"] and data == weights_for(meta["step"], mib)
    _log(journal, event="resumed", step=meta["step"], intact=intact)
    return int(meta["step"])


def _write_state(state: Path, step: int, mib: int, in_place: bool) -> None:
    data = weights_for(step, mib)
    weights = state / "weights.bin"
    if in_place and weights.exists():
        with open(weights, "r+b") as file:  # the same inode, truncated and rewritten
            file.truncate(0)
            file.write(data)
    else:
        weights.write_bytes(data)
    (state / "meta.json").write_text(json.dumps({"step": step, "digest": hashlib.sha256(data).hexdigest()}))


def train(steps: int, mib: int, every: int, step_s: float, features: list[str], journal: str) -> int:
    """Train to ``steps``, resuming from the checkpoint; the README's loop at each step's end."""
    _log(journal, event="started")
    checkpoint = current_checkpoint()
    start = _restored_step(checkpoint.load_sync(), mib, journal)
    state = Path(tempfile.mkdtemp(prefix="state-"))
    loader = _data_loader() if "fork" in features else None
    busy = b"x" * (32 << 20) if "cpu" in features else b""
    try:
        for step in range(start, steps):
            if busy:
                hashlib.sha256(busy).digest()  # C calls on the main thread
                sum(range(1_000_000))
            else:
                time.sleep(step_s)
            if loader is not None:
                sum(int(batch.sum()) for (batch,) in loader)
            if checkpoint.preempted:
                checkpoint.hold_background_save()  # the older upload waits for the final save
            _write_state(state, step + 1, mib, "inplace" in features)
            _log(journal, event="step", step=step + 1)
            if (step + 1) % every == 0 or checkpoint.preempted:
                background = not checkpoint.preempted
                _log(journal, event="save", step=step + 1, background=background)
                began = time.monotonic()
                checkpoint.save_sync(state, background=background)
                _log(
                    journal,
                    event="saved",
                    step=step + 1,
                    background=background,
                    took=time.monotonic() - began,
                )
            if checkpoint.preempted:
                _log(journal, event="raising", step=step + 1)
                raise checkpoint.preemption()
        checkpoint.wait_sync()
        _log(journal, event="finished", step=steps)
        return steps
    finally:
        shutil.rmtree(state, ignore_errors=True)
