"""The S3 servers ``objectstore.py`` measures against: s3rver (default) or the test suite's moto.

s3rver (npm, ``benchmarks/s3rver/package.json``) stores each object as a file and streams a
ranged GET from it, so a range costs what it transfers. ``serve.js`` makes two things behave as
on S3: If-Match on GET (which s3rver ignores), and CompleteMultipartUpload, which s3rver would
finish by hashing and copying the whole object (0.4-1 s per 256 MiB here, even on tmpfs) while
S3 copies nothing: the completed object is served from its parts. Its data lives on tmpfs
(``/dev/shm``) where the machine has one. moto stays for the test suite, where correctness
matters and speed does not: it re-reads the whole object for every ranged GET.

``install_s3rver()`` runs ``npm ci`` in ``benchmarks/s3rver`` (only the benchmark needs it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib.processes import free_port

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
S3RVER_DIR = HERE / "s3rver"
S3RVER_BIN = S3RVER_DIR / "node_modules" / "s3rver"
S3RVER_KEY = "S3RVER"  # s3rver's built-in account
REGION = "us-east-1"
START_TIMEOUT_S = 30.0
TMPFS = Path("/dev/shm")


class ServerError(RuntimeError):
    """The S3 server could not be installed or started; the message says what to do."""


@dataclass
class S3Server:
    """A running S3 server on 127.0.0.1 and how to reach it."""

    name: str
    port: int
    bucket: str
    key: str
    secret: str
    stop_callbacks: list[Any] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        while self.stop_callbacks:
            self.stop_callbacks.pop()()


def _wait_for_port(port: int, process: subprocess.Popen[bytes] | None, log: Path | None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            detail = log.read_text()[-2000:] if log is not None and log.exists() else ""
            raise ServerError(f"the S3 server exited with {process.returncode} at start:\n{detail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise ServerError(f"the S3 server did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S:.0f} s")


def s3rver_installed() -> bool:
    return (S3RVER_BIN / "package.json").exists()


def install_s3rver() -> None:
    """``npm ci`` from ``benchmarks/s3rver/package-lock.json``."""
    npm = shutil.which("npm")
    if npm is None:
        raise ServerError("npm is not on PATH: install Node.js (Debian: apt-get install nodejs npm)")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=S3RVER_DIR, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise ServerError(f"npm ci in {S3RVER_DIR} failed:\n{done.stderr[-2000:]}")


def _data_directory() -> Path:
    """A fresh directory on tmpfs if there is one, else in the default temporary directory."""
    on_tmpfs = TMPFS.is_dir() and os.access(TMPFS, os.W_OK)
    return Path(tempfile.mkdtemp(prefix="s3rver-", dir=TMPFS if on_tmpfs else None))


def start_s3rver(bucket: str, install: bool = False) -> S3Server:
    """s3rver on a free port with ``bucket`` created, data in a temporary directory on tmpfs."""
    if not s3rver_installed():
        if not install:
            raise ServerError(f"s3rver is not installed: run with --install-server (npm ci in {S3RVER_DIR})")
        install_s3rver()
    node = shutil.which("node")
    if node is None:
        raise ServerError("node is not on PATH: install Node.js (Debian: apt-get install nodejs)")
    data = _data_directory()
    log = data.with_name(data.name + ".log")
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [node, str(S3RVER_DIR / "serve.js"), str(port), str(data), bucket],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=S3RVER_DIR,
        )

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(data, ignore_errors=True)
        log.unlink(missing_ok=True)

    server = S3Server("s3rver", port, bucket, S3RVER_KEY, S3RVER_KEY, [stop])
    try:
        _wait_for_port(port, process, log)
    except BaseException:
        server.stop()
        raise
    return server


def _test_servers() -> Any:
    """``tests/storage_servers.py``, imported by name: it is the test suite's, not typed here."""
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module("tests.storage_servers")


def start_moto(bucket: str, log_dir: Path) -> S3Server:
    """The test suite's moto server (slow ranged GETs; for smoke tests and comparison).

    The bucket's name is ``bucket`` with a unique suffix (the test helper's naming).
    """
    servers = _test_servers()
    moto = servers.start_moto(log_dir=log_dir)
    try:
        bucket = servers.create_bucket(moto, bucket)
    except BaseException:
        moto.stop()
        raise
    options = moto.storage_options
    port = int(moto.endpoint.rsplit(":", 1)[1])
    return S3Server("moto", port, bucket, str(options["key"]), str(options["secret"]), [moto.stop])


@contextlib.contextmanager
def running(name: str, bucket: str, install: bool, log_dir: Path) -> Iterator[S3Server]:
    server = start_s3rver(bucket, install) if name == "s3rver" else start_moto(bucket, log_dir)
    try:
        yield server
    finally:
        server.stop()
