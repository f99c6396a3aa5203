"""One attempt of the training job that ``preemption.py`` preempts, run in a forked child.

The job is real training: a small torch MLP and its Adam optimizer, one step on a seeded batch
at a time (padded with sleep to the configured step time, so the figures do not depend on the
CPU and the cores stay free for the saves), plus ``extra_mib`` MiB of further state in files.
Every ``every`` steps it writes its state directory (each file written new, then renamed over
the old one, as training code does) and saves it with the checkpoint helper under test:

* ``oneline``: ``flyte_checkpoint``, the documented loop (background saves; after a notice,
  one blocking save of the newest state, then ``raise checkpoint.preemption()``);
* ``nochange``: ``flyte_checkpoint`` with background saves and no preemption code at all; the
  preemption handler (installed at the top, as the runners do) ends the attempt;
* ``reference``: ``flyte.Checkpoint`` of flyte 2.12.1, blocking saves (it has no background
  save and no preemption handling; SIGTERM's default action ends the process).

The state directory holds ``0-meta.json`` (the step and a digest of the extra files; its name
sorts first, so it is the first member of both implementations' ``.tar.gz`` and the supervisor
can read the step of a stored object from its first kilobytes), ``model.pt`` (the step, the
model and optimizer state and the same digest) and ``extra/shard-N.bin`` (a header naming the
step and the shard, then random bytes). A restored state is accepted only if all three agree.

A scenario (``spec["scenario"]``, issue 29's cases an outside harness broke) changes the job:

* ``plain``: as above;
* ``in-place``: ``model.pt`` is rewritten in place (``torch.save`` to the same path, the inode a
  background save's snapshot links) after every step, and at a save the extra files are too
  (``open(path, "r+b")``), so background saves find their input changed;
* ``fork-children``: a torch DataLoader with two ``fork`` workers (persistent) hands the job a
  batch every step; the attempt is its own process group, which the supervisor signals whole,
  as the kubelet signals a container;
* ``long-c-call``: every step holds the GIL in one C call of 0.3-1 s (``sum(range(n))``), so the
  notice arrives mid-call and Python runs its handler only after it;
* ``startup-load`` and ``s3-background-then-notice``: the job is plain; the supervisor times the
  SIGTERM (during start-up and the load; while a background save is uploading).

Everything the supervisor learns comes from an append-only event log of JSON lines, each with
``time.monotonic()`` (one clock for every process on Linux): ``started``, ``resumed``,
``step``, ``save`` (writing the state directory), ``submit`` (calling ``save_sync``), ``saved``
(it returned), ``exception``, ``done``; and per scenario ``children`` (the workers' pids) and
``call``/``called`` (around the long C call). Module-level imports are the standard
library only: the supervisor imports this module for the function it starts, and the fork
server has torch and both checkpoint libraries imported before any attempt is forked.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHARDS = 4
HEADER_BYTES = 64
META = "0-meta.json"
MODEL = "model.pt"
EXTRA = "extra"
MIB = 1 << 20

PRELOAD = (
    "torch",
    "torch._dynamo",  # imported by the first optimizer built: 2-3 s of the cold start here
    "flyte_checkpoint",
    "flyte_checkpoint.storage.stores.s3",
    "flyte",
    "flyte.io",
    __name__,
)
"""What the fork server imports once, so an attempt starts in milliseconds, not seconds."""


class Events:
    """The attempt's event log: one ``write`` per line, so a kill never leaves half a line behind
    a complete one."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": time.monotonic(), **fields}) + "\n"
        os.write(self.fd, line.encode())


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines of an event log (a last line cut short by a kill is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            events.append(json.loads(line))
    return events


# ---------------------------------------------------------------------------------------------
# The training state
# ---------------------------------------------------------------------------------------------


def _build(seed: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, optimizer


def _train_step(model: Any, optimizer: Any, step: int, seed: int) -> None:
    import torch

    batch = torch.randn(32, 64, generator=torch.Generator().manual_seed(seed * 1_000_003 + step))
    loss = ((model(batch) - torch.sin(batch)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def model_digest(model: Any, optimizer: Any) -> str:
    """SHA-256 of the parameters and the optimizer's moments: equal only for bit-equal training."""
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    for index in sorted(optimizer.state_dict()["state"]):
        moments = optimizer.state_dict()["state"][index]
        for name in sorted(moments):
            digest.update(moments[name].detach().numpy().tobytes())
    return digest.hexdigest()


def _header(step: int, shard: int) -> bytes:
    return f"step={step} shard={shard}\n".encode().ljust(HEADER_BYTES, b" ")


def _extra_digest(headers: list[bytes], body_digests: list[bytes]) -> str:
    digest = hashlib.sha256()
    for header, body in zip(headers, body_digests, strict=True):
        digest.update(header)
        digest.update(body)
    return digest.hexdigest()


def _rewrite(path: Path, chunks: list[bytes]) -> None:
    """Rewrite ``path`` in place, the same inode (a background save's snapshot may link it)."""
    if not path.exists():
        path.touch()
    with open(path, "r+b") as out:
        for chunk in chunks:
            out.write(chunk)
        out.truncate()


def _replace(path: Path, chunks: list[bytes]) -> None:
    """Write a new file and rename it over ``path`` (a background save's snapshot keeps the old)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as out:
        for chunk in chunks:
            out.write(chunk)
    os.replace(partial, path)


class StateWriter:
    """Writes the state directory for a step: extra shards, ``model.pt``, then ``0-meta.json``."""

    def __init__(self, root: Path, extra_mib: float, in_place: bool = False) -> None:
        self.root = root
        self.in_place = in_place
        """Rewrite each file in place instead of writing a new one and renaming it over."""
        (root / EXTRA).mkdir(parents=True, exist_ok=True)
        shard_bytes = max(1, int(extra_mib * MIB) // SHARDS)
        self.bodies = [os.urandom(shard_bytes) for _ in range(SHARDS)]
        self.body_digests = [hashlib.sha256(body).digest() for body in self.bodies]

    def write(self, step: int, model: Any, optimizer: Any) -> None:
        headers = [_header(step, shard) for shard in range(SHARDS)]
        digest = _extra_digest(headers, self.body_digests)
        put = _rewrite if self.in_place else _replace
        for shard, (header, body) in enumerate(zip(headers, self.bodies, strict=True)):
            put(self.root / EXTRA / f"shard-{shard}.bin", [header, body])
        self.write_model(step, model, optimizer, digest)
        put(self.root / META, [json.dumps({"step": step, "extra_digest": digest}).encode()])

    def write_model(self, step: int, model: Any, optimizer: Any, digest: str | None = None) -> None:
        """``model.pt`` for ``step``; with ``in_place``, ``torch.save`` to the same path."""
        import torch

        if digest is None:  # the in-place writer between saves: the extra files stay as they are
            digest = json.loads((self.root / META).read_text())["extra_digest"]
        state = {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "extra_digest": digest,
        }
        if self.in_place:
            torch.save(state, self.root / MODEL)
            return
        partial = self.root / f".{MODEL}.{os.getpid()}.partial"
        torch.save(state, partial)
        os.replace(partial, self.root / MODEL)


class Rejected(Exception):
    """A restored state that is not one consistent step: the verdict and why."""

    def __init__(self, verdict: str, detail: str) -> None:
        super().__init__(detail)
        self.verdict = verdict


def restore(root: Path, model: Any, optimizer: Any) -> int:
    """Load a restored state directory into the model and optimizer; its step, or :class:`Rejected`."""
    import torch

    try:
        meta = json.loads((root / META).read_text())
        state = torch.load(root / MODEL, weights_only=True)
        shards = [(root / EXTRA / f"shard-{shard}.bin").read_bytes() for shard in range(SHARDS)]
    except Exception as exc:
        raise Rejected("unreadable", f"{type(exc).__name__}: {exc}") from None
    step = int(meta["step"])
    headers = [data[:HEADER_BYTES] for data in shards]
    found = [header.split(b" ")[0].decode(errors="replace") for header in headers]
    if state["step"] != step or any(name != f"step={step}" for name in found):
        raise Rejected("mixed", f"meta step {step}, model.pt step {state['step']}, shards {found}")
    digest = _extra_digest(headers, [hashlib.sha256(data[HEADER_BYTES:]).digest() for data in shards])
    if digest != meta["extra_digest"] or digest != state["extra_digest"]:
        raise Rejected("mixed", f"step {step}: the extra files' digest differs from the recorded one")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return step


# ---------------------------------------------------------------------------------------------
# The checkpoint helpers under test
# ---------------------------------------------------------------------------------------------


def _helper(spec: dict[str, Any]) -> Any:
    if spec["variant"] == "reference":
        flyte = importlib.import_module("flyte")
        return flyte.Checkpoint(spec["dest"], spec.get("src"))
    from flyte_checkpoint import Checkpoint

    return Checkpoint(spec["dest"], spec.get("src"), storage_options=spec.get("storage_options"))


def _load(helper: Any, spec: dict[str, Any], model: Any, optimizer: Any) -> tuple[int, str, str]:
    """The step to resume from, the verdict (ok, none, corrupt, unreadable, mixed) and a detail."""
    from flyte_checkpoint.errors import CheckpointCorruptError

    try:
        restored = helper.load_sync()
    except CheckpointCorruptError as exc:
        return 0, "corrupt", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return 0, "unreadable", f"{type(exc).__name__}: {exc}"
    if restored is None:
        return 0, "none", ""
    try:
        return restore(Path(restored), model, optimizer), "ok", ""
    except Rejected as exc:
        return 0, exc.verdict, str(exc)


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def _enter(spec: dict[str, Any]) -> Events:
    """Per-attempt process setup: output to files, environment, a private temporary directory."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(spec[name], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.update(spec.get("env", {}))
    os.environ["TMPDIR"] = spec["tmp"]
    tempfile.tempdir = None  # the fork server may have cached another one
    import torch

    torch.set_num_threads(1)
    return Events(spec["events"])


def attempt(spec: dict[str, Any]) -> None:
    """One attempt: restore, train from there, save every ``every`` steps (see the module doc)."""
    # Its own process group, as a container's processes are: the supervisor can signal the job
    # and every process it forks at once, the way the kubelet signals the container.
    os.setpgid(0, 0)
    events = _enter(spec)
    if spec["variant"] != "reference":
        from flyte_checkpoint.preemption import install_preemption_handler

        install_preemption_handler()  # the grace period from FLYTE_CHECKPOINT_GRACE_SECONDS
    events.emit("started", pid=os.getpid())
    try:
        _train(spec, events)
    except BaseException as exc:
        events.emit("exception", kind=type(exc).__name__, message=str(exc)[:500])
        raise


def _worker_batches(events: Events) -> Any:
    """Batches from a DataLoader whose two workers are ``fork`` children kept alive across steps."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(
        TensorDataset(torch.arange(1 << 20)),
        batch_size=32,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
    )
    batches = iter(loader)
    next(batches)  # the workers are up
    events.emit("children", pids=[worker.pid for worker in getattr(batches, "_workers", [])])
    return batches


def _long_call(spec: dict[str, Any], step: int, events: Events) -> None:
    """One C call that holds the GIL for 0.3-1 s (no bytecode runs, so no Python signal handler)."""
    seconds = random.Random(f"{spec['seed']}/{step}").uniform(*spec["call_s"])
    events.emit("call", step=step, seconds=seconds)
    sum(range(int(seconds * spec["call_rate"])))
    events.emit("called", step=step)


def call_rate(probe: int = 2_000_000) -> float:
    """Items per second ``sum(range(n))`` gets through here (what sizes :func:`_long_call`)."""
    started = time.perf_counter()
    sum(range(probe))
    return probe / (time.perf_counter() - started)


def _train(spec: dict[str, Any], events: Events) -> None:
    variant, every, seed = spec["variant"], spec["every"], spec["seed"]
    scenario = spec.get("scenario", "plain")
    model, optimizer = _build(seed)
    writer = StateWriter(Path(spec["state_dir"]), spec["extra_mib"], in_place=scenario == "in-place")
    helper = _helper(spec)
    step, verdict, detail = _load(helper, spec, model, optimizer)
    if verdict != "ok":
        model, optimizer = _build(seed)  # as a user would: start over
        step = 0
    if writer.in_place:
        writer.write(step, model, optimizer)  # the files every later step rewrites in place
    batches = _worker_batches(events) if scenario == "fork-children" else None
    events.emit("resumed", step=step, verdict=verdict, detail=detail[:500])

    def save(at: int, background: bool) -> None:
        events.emit("save", step=at, background=background)
        writer.write(at, model, optimizer)
        events.emit("submit", step=at, background=background)
        if variant == "reference":
            helper.save_sync(writer.root)  # it has no background saves
        else:
            helper.save_sync(writer.root, background=background)
        events.emit("saved", step=at, background=background)

    for current in range(step + 1, spec["total_steps"] + 1):
        started = time.monotonic()
        if batches is not None:
            next(batches)  # not used: the training stays bit-equal to the uninterrupted run's
        if scenario == "long-c-call":
            _long_call(spec, current, events)
        _train_step(model, optimizer, current, seed)
        time.sleep(max(0.0, spec["step_s"] - (time.monotonic() - started)))
        events.emit("step", step=current)
        if writer.in_place and current % every:
            # As such code does: torch.save(state, same_path) after every step, then the loop.
            writer.write_model(current, model, optimizer)
        if variant == "oneline":
            # The documented loop, as a user writes it.
            if helper.preempted:
                helper.hold_background_save()  # the older upload waits for the final save
            if current % every == 0 or helper.preempted:
                save(current, background=not helper.preempted)
            if helper.preempted:
                raise helper.preemption()
        elif current % every == 0:
            save(current, background=variant == "nochange")
    if variant != "reference":
        helper.close()
    events.emit("done", step=spec["total_steps"], model_digest=model_digest(model, optimizer))


def baseline(spec: dict[str, Any]) -> None:
    """The same training without pauses, saves or preemptions: the digest every run must end with."""
    events = _enter(spec)
    model, optimizer = _build(spec["seed"])
    for current in range(1, spec["total_steps"] + 1):
        _train_step(model, optimizer, current, spec["seed"])
    events.emit("done", step=spec["total_steps"], model_digest=model_digest(model, optimizer))


def calibrate(spec: dict[str, Any]) -> None:
    """Time ``saves`` blocking saves of the state directory (writing it included), nothing else."""
    events = _enter(spec)
    model, optimizer = _build(spec["seed"])
    helper = _helper(spec)
    writer = StateWriter(Path(spec["state_dir"]), spec["extra_mib"])
    durations = []
    for save in range(spec["saves"] + 1):
        started = time.monotonic()
        writer.write(save, model, optimizer)
        helper.save_sync(writer.root)
        if save:  # the first save pays for imports and connections
            durations.append(time.monotonic() - started)
    events.emit("calibrated", durations=durations)
    if spec["variant"] != "reference":
        helper.close()
    sys.stdout.flush()
