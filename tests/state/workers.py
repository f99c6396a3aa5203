"""Components and child-process entry points for the multi-part checkpoint tests.

Child processes are started with the ``spawn`` method, which pickles their target by reference,
so every function a child runs lives here, in an importable module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from flyte_checkpoint.state import save_checkpoint, write_part


class Unit:
    """A component holding a dict of index -> value, like one storage unit of the spec."""

    def __init__(self, data: Mapping[int, Any] | None = None) -> None:
        self.data: dict[int, Any] = dict(data or {})

    def state_dict(self) -> dict[str, Any]:
        return {"data": dict(self.data)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.data = dict(state["data"])


class Controller:
    """A component recording which indexes are produced, like the spec's controller."""

    def __init__(self, produced: set[int] | None = None, step: int = 0) -> None:
        self.produced: set[int] = set(produced or ())
        self.step = step

    def state_dict(self) -> dict[str, Any]:
        return {"produced": sorted(self.produced), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.produced = set(state["produced"])
        self.step = state["step"]


class BrokenOnLoad(Unit):
    """Applies half of the first state it is given, then raises (the worst case for a
    transactional load); later states, such as a rollback to its previous one, apply normally."""

    def __init__(self, data: Mapping[int, Any] | None = None) -> None:
        super().__init__(data)
        self.failed = False

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.failed:
            self.failed = True
            self.data = {0: "half-applied"}
            raise RuntimeError("injected failure while applying")
        super().load_state_dict(state)


class Notes:
    """A component that streams its own data: it writes and reads its part as a file."""

    def __init__(self, text: str = "") -> None:
        self.text = text

    def save_to_path(self, path: Path) -> None:
        path.write_text(self.text, encoding="utf-8")

    def load_from_path(self, path: Path) -> None:
        self.text = path.read_text(encoding="utf-8")


def generation_unit(generation: int, position: int, size: int) -> Unit:
    """A part whose every value says which save (generation) and position it belongs to."""
    blob = bytes([generation % 256]) * size
    return Unit({0: (generation, position), 1: blob})


# --------------------------------------------------------------------------- child processes


def rank_writes_part(
    checkpoint_dir: str,
    version_id: str,
    rank: int,
    world_size: int,
    storage_options: dict[str, Any] | None,
    mode: str = "ok",
) -> None:
    """A rank as torchrun starts it: RANK and WORLD_SIZE in the environment, no position given.

    ``mode``: ``ok``; ``raise`` (its state_dict raises); ``exit`` (exits 3 without writing);
    ``kill`` (SIGKILLs itself before writing); ``hang`` (never writes; the test kills it).
    """
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    if mode == "exit":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(120)
        return
    component: object = Unit({rank: f"rank {rank} state", 100: rank * 10})
    if mode == "raise":
        component = _RaisingUnit()
    write_part(checkpoint_dir, None, component, version_id=version_id, storage_options=storage_options)  # type: ignore[arg-type]


class _RaisingUnit:
    def state_dict(self) -> dict[str, Any]:
        raise ValueError("disk of rank exploded")

    def load_state_dict(self, state: Any) -> None:  # pragma: no cover - never loaded
        raise AssertionError


def rank_loads_part(
    checkpoint_dir: str,
    version_id: str,
    rank: int,
    world_size: int,
    storage_options: dict[str, Any] | None,
    results: Any,
) -> None:
    """A rank restoring its own part; puts ``(rank, data)`` on the ``results`` queue."""
    from flyte_checkpoint.state import load_part

    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    unit = Unit()
    load_part(checkpoint_dir, None, unit, version_id=version_id, storage_options=storage_options)
    results.put((rank, unit.data))


def _refuse_to_unpickle() -> None:
    raise RuntimeError("this state cannot be decoded here")


class UndecodableValue:
    """Pickles fine, fails to unpickle: a part that verifies but cannot be decoded."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_refuse_to_unpickle, ())


class AlwaysBroken(Unit):
    """Raises on every load_state_dict, so rolling it back fails too."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise RuntimeError("cannot take any state")


# --------------------------------------------------------------------------- SIGKILL trials


_MARKERS = {b"r": "ready", b"w": "wrote", b"d": "done"}


def saver_fork_server(conn: Connection) -> None:
    """Fork one saver process per request, report its progress, reap it once the test kills it.

    Spawned once per test (so imports are paid once); each saver is ``os.fork()``-ed from this
    single-threaded process and starts in milliseconds, which keeps many kill trials cheap.
    Protocol: receive ``(checkpoint_dir, storage_options, generation, parts, part_size)`` or
    ``None`` (stop); send ``("started", pid)``, then ``("ready", t)`` when the save starts, one
    ``("wrote", t)`` each time an object becomes visible in storage, ``("done", t)`` when the save
    returned (``t`` is ``time.monotonic()``), and finally ``("exited", wait_status)``.
    """
    import importlib
    import threading

    # Import what a saver will need once, here, rather than in every forked saver (imports start
    # no threads, so forking stays safe).
    for module in ("s3fs", "aiobotocore.session", "botocore.client", "aiohttp"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    while (request := conn.recv()) is not None:
        if threading.active_count() != 1:
            raise RuntimeError("forking is only safe from a single-threaded process")
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the saver, killed by the test
            os.close(read_end)
            code = 1
            try:
                _save_and_wait(write_end, *request)
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        conn.send(("started", pid))
        with os.fdopen(read_end, "rb", buffering=0) as progress:
            while marker := progress.read(1):
                conn.send((_MARKERS[marker], time.monotonic()))
        _, status = os.waitpid(pid, 0)
        conn.send(("exited", status))


def _save_and_wait(
    progress: int,
    checkpoint_dir: str,
    storage_options: dict[str, Any] | None,
    generation: int,
    parts: int,
    part_size: int,
) -> None:  # pragma: no cover - runs in the forked saver
    from flyte_checkpoint.state.layout import Layout
    from flyte_checkpoint.storage.base import ObjectInfo, ObjectWriter

    # Every object of a save (part, manifest, pointer...) becomes visible at ObjectWriter.commit:
    # report each one, so the test can kill the saver right after any of them.
    commit = ObjectWriter.commit

    def commit_and_report(writer: ObjectWriter) -> ObjectInfo:
        info = commit(writer)
        os.write(progress, b"w")
        return info

    setattr(ObjectWriter, "commit", commit_and_report)  # noqa: B010 - instrumenting this process only
    units = [generation_unit(generation, position, part_size) for position in range(parts)]
    controller = Controller({generation}, step=generation)
    # Connect to the storage first, so that the kill points fall within the save itself.
    Layout.of(checkpoint_dir, storage_options).backend.info(f"{checkpoint_dir}/COMMITTED.json")
    os.write(progress, b"r")
    save_checkpoint(
        checkpoint_dir,
        controller=controller,
        parts=units,
        metadata={"generation": generation},
        max_workers=1,
        storage_options=storage_options,
    )
    os.write(progress, b"d")
    time.sleep(120)
