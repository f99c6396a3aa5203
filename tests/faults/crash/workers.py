"""Child processes for the crash tests: one save or one load, narrated line by line on stdout.

Run from the repository root::

    python -m tests.faults.crash.workers save --kind bytes|file|dir --source PATH --dest URI
                                      [--start-at T] [--fsize-limit BYTES]
    python -m tests.faults.crash.workers load --src URI [--start-at T] [--dest URI --run-name RUN
                                      --action-name ACTION] [--linger SECONDS]
    python -m tests.faults.crash.workers serve [MODULE ...]

Storage options (endpoint, credentials) come as JSON in ``$FLYTE_CHECKPOINT_CRASH_STORAGE_OPTIONS``.

Each line of output is flushed at once, so the parent knows how far the child got when it kills:

``ready``
    the helper is constructed (imports done)
``started T``
    the input is prepared (bytes are in memory) and ``save_sync``/``load_sync`` is being called
    at ``time.monotonic()`` ``T`` (one clock for every process on Linux)
``progress DONE``
    the progress callback ran (at most once per MiB written or read)
``committed T``
    ``save_sync`` returned at ``T``: the new object is in place
``restored DIGEST PATH``
    ``load_sync`` returned ``PATH``, whose content has :func:`content_digest` ``DIGEST``
``none``
    ``load_sync`` returned ``None``
``error TYPE MESSAGE``
    the call raised ``TYPE``; the exit status is 1

``--start-at T`` waits until ``time.monotonic()`` reaches ``T`` before starting, so that two
workers can start together. ``--fsize-limit`` simulates a full disk: just before saving, the
child ignores ``SIGXFSZ`` and sets ``RLIMIT_FSIZE``, so a write past the limit fails with
``EFBIG`` instead of killing the process.

``serve`` is the zygote of :class:`tests.faults.crash.harness.Zygote`: it imports this package (and the
named modules) once, says ``serving``, then answers JSON requests on stdin, one per line:
``{"fork": ARGV, "env": {...}, "narration": FIFO}`` forks a child that runs ``main(ARGV)`` with
the FIFO as stdout (reply ``forked PID``); ``{"reap": PID}`` waits for that child (reply
``reaped PID STATUS``). At the end of stdin it kills and reaps the children left, and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import hashlib
import importlib
import json
import os
import resource
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STORAGE_OPTIONS_ENV = "FLYTE_CHECKPOINT_CRASH_STORAGE_OPTIONS"
_CHUNK = 1 << 20


def content_digest(path: Path) -> str:
    """A digest of what ``path`` holds: a file's bytes, or a tree's names, kinds, contents and links.

    A directory's digest does not include its own name, so a source directory and the workspace
    it was restored into digest alike when their contents match.
    """
    digest = hashlib.sha256()
    if not path.is_dir():
        digest.update(b"file\0")
        _hash_file(digest, path)
        return digest.hexdigest()
    digest.update(b"tree\0")
    for entry in sorted(path.rglob("*")):
        name = entry.relative_to(path).as_posix().encode()
        mode = entry.lstat().st_mode
        if stat.S_ISLNK(mode):
            digest.update(b"L\0" + name + b"\0" + os.readlink(entry).encode() + b"\0")
        elif stat.S_ISDIR(mode):
            digest.update(b"D\0" + name + b"\0")
        else:
            digest.update(b"F\0" + name + b"\0" + str(entry.stat().st_size).encode() + b"\0")
            _hash_file(digest, entry)
    return digest.hexdigest()


def _hash_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)


def storage_options_from_env() -> dict[str, Any] | None:
    """The storage options the parent passed in :data:`STORAGE_OPTIONS_ENV`, if any."""
    raw = os.environ.get(STORAGE_OPTIONS_ENV)
    if not raw:
        return None
    options: dict[str, Any] = json.loads(raw)
    return options


def _say(*words: object) -> None:
    sys.stdout.write(" ".join(str(word) for word in words) + "\n")
    sys.stdout.flush()


def _progress(done: int, total: int | None) -> None:
    _say("progress", done)


def _wait_until(start_at: float | None) -> None:
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.monotonic()))


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


def _save(args: argparse.Namespace) -> None:
    from flyte_checkpoint import Checkpoint

    checkpoint = Checkpoint(args.dest, storage_options=storage_options_from_env())
    _say("ready")
    _wait_until(args.start_at)
    data: bytes | Path = Path(args.source).read_bytes() if args.kind == "bytes" else Path(args.source)
    if args.fsize_limit is not None:
        _limit_file_size(args.fsize_limit)
    _say("started", time.monotonic())
    checkpoint.save_sync(data, progress=_progress)
    _say("committed", time.monotonic())


def _load(args: argparse.Namespace) -> None:
    from flyte_checkpoint import Checkpoint

    checkpoint = Checkpoint(
        args.dest,
        args.src,
        storage_options=storage_options_from_env(),
        repair_prev_uri=False,
        run_name=args.run_name,
        action_name=args.action_name,
    )
    _say("ready")
    _wait_until(args.start_at)
    _say("started", time.monotonic())
    restored = checkpoint.load_sync(progress=_progress)
    if restored is None:
        _say("none")
    else:
        _say("restored", content_digest(restored), restored)
    time.sleep(args.linger)  # an attempt goes on after its load: its background work with it


# -- the zygote -------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> None:
    import flyte_checkpoint  # noqa: F401 - imported once here, inherited by every fork

    for module in args.preload:
        importlib.import_module(module)
    _say("serving")
    children: set[int] = set()
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if "fork" in request:
                pid = _fork(request)
                children.add(pid)
                _say("forked", pid)
            else:
                pid = int(request["reap"])
                _, status = os.waitpid(pid, 0)
                children.discard(pid)
                _say("reaped", pid, os.waitstatus_to_exitcode(status))
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _fork(request: dict[str, Any]) -> int:
    narration = os.open(request["narration"], os.O_WRONLY | os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    zygote = os.getpid()
    pid = os.fork()
    if pid:
        os.close(narration)
        return pid
    code = 70
    try:
        os.setsid()
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: die with the zygote
        if os.getppid() != zygote:
            os._exit(code)
        os.dup2(narration, 1)
        os.close(narration)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR may have changed
        code = main(request["fork"])
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.crash.workers")
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save", help="save one checkpoint, narrating progress")
    save.add_argument("--kind", choices=("bytes", "file", "dir"), required=True)
    save.add_argument("--source", required=True, help="the file or directory to save")
    save.add_argument("--dest", required=True)
    save.add_argument("--start-at", type=float, help="time.monotonic() at which to start")
    save.add_argument("--fsize-limit", type=int, help="RLIMIT_FSIZE for the save, in bytes")
    load = commands.add_parser("load", help="load one checkpoint, narrating progress")
    load.add_argument("--src", required=True)
    load.add_argument("--start-at", type=float, help="time.monotonic() at which to start")
    load.add_argument("--dest", default="unused-destination", help="where this attempt would save")
    load.add_argument("--run-name", help="the run's name (per-attempt layouts)")
    load.add_argument("--action-name", help="the action's name (per-attempt layouts)")
    load.add_argument("--linger", type=float, default=0.0, help="seconds to stay alive after loading")
    serve = commands.add_parser("serve", help="fork workers on request (see the module docstring)")
    serve.add_argument("preload", nargs="*", help="modules to import before forking")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        _serve(args)
        return 0
    try:
        if args.command == "save":
            _save(args)
        else:
            _load(args)
    except Exception as exc:
        message = " ".join(str(exc).split())
        _say("error", type(exc).__name__, message)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
