"""The loopback storage emulators start, serve fsspec, and stop (see storage_servers.py)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.storage_servers import (
    Backend,
    StorageServer,
    _http_status,
    _start,
    create_bucket,
    start_server,
)

BACKENDS: tuple[Backend, ...] = ("s3", "gcs", "azure")
MiB = 2**20
#: Write block sizes: s3fs refuses < 5 MiB; gcsfs needs a multiple of 256 KiB; Azure has no
#: minimum. Each is small enough that 12 MiB takes several parts/chunks/blocks.
WRITE_BLOCK_SIZE: dict[str, int] = {"s3": 5 * MiB, "gcs": 1 * MiB, "azure": 4 * MiB}
REPO_ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


def _process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _process_gone(pid):
            return True
        time.sleep(0.05)
    return _process_gone(pid)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_server_round_trips_bytes_and_a_zero_byte_object_through_fsspec(
    backend: Backend, tmp_path: Path
) -> None:
    server = start_server(backend, log_dir=tmp_path)
    try:
        bucket = create_bucket(server)
        fs = server.filesystem()
        fs.pipe(f"{bucket}/dir/hello.bin", b"hello, storage")
        assert fs.cat(f"{bucket}/dir/hello.bin") == b"hello, storage"

        fs.pipe(f"{bucket}/empty-piped", b"")
        with fs.open(f"{bucket}/empty-opened", "wb"):
            pass
        fs.invalidate_cache()
        for name in ("empty-piped", "empty-opened"):
            assert fs.cat(f"{bucket}/{name}") == b""
            assert fs.info(f"{bucket}/{name}")["size"] == 0
        assert sorted(fs.ls(bucket, detail=False)) == sorted(
            f"{bucket}/{name}" for name in ("dir", "empty-opened", "empty-piped")
        )
    finally:
        server.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_server_accepts_a_streamed_12_mib_write_in_several_parts(
    backend: Backend, tmp_path: Path
) -> None:
    data = os.urandom(12 * MiB)
    server = start_server(backend, log_dir=tmp_path)
    try:
        bucket = create_bucket(server)
        fs = server.filesystem()
        path = f"{bucket}/streamed.bin"
        with fs.open(path, "wb", block_size=WRITE_BLOCK_SIZE[backend]) as f:
            for start in range(0, len(data), 3 * MiB // 2):
                f.write(data[start : start + 3 * MiB // 2])
        fs.invalidate_cache()
        assert fs.info(path)["size"] == len(data)
        assert hashlib.sha256(fs.cat(path)).digest() == hashlib.sha256(data).digest()
    finally:
        server.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_stopping_a_server_ends_its_process_and_closes_its_log(backend: Backend, tmp_path: Path) -> None:
    server = start_server(backend, log_dir=tmp_path)
    try:
        assert server.is_running()
        assert server.endpoint.startswith("http://127.0.0.1:")
        assert server.storage_options
        assert server.env
    finally:
        server.stop()
    assert not server.is_running()
    assert _wait_gone(server.pid, 5)
    assert server._log.closed
    server.stop()  # idempotent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_server_dies_when_the_process_that_started_it_is_killed(backend: Backend, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys, time
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.storage_servers import start_server
        server = start_server({backend!r}, log_dir=__import__("pathlib").Path({str(tmp_path)!r}))
        print(json.dumps({{"pid": server.pid}}), flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    server_pid: int | None = None
    try:
        assert parent.stdout is not None
        ready, _, _ = select.select([parent.stdout], [], [], 60)
        assert ready, "the child did not report its server in time"
        line = parent.stdout.readline().decode()
        server_pid = int(json.loads(line)["pid"])
        assert not _process_gone(server_pid)
        parent.kill()
        parent.wait(timeout=10)
        assert _wait_gone(server_pid, 10), f"server {server_pid} outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if server_pid is not None and not _process_gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_advertised_environment_variables_alone_configure_a_client(
    backend: Backend, tmp_path: Path
) -> None:
    server = start_server(backend, log_dir=tmp_path)
    try:
        bucket = create_bucket(server)
        path = f"{bucket}/from-env"
        server.filesystem().pipe(path, b"configured by env")
        script = textwrap.dedent(
            f"""
            import fsspec, fsspec.config
            if {backend!r} == "gcs":
                # Never let gcsfs fall back to google.auth.default (metadata server probe).
                assert fsspec.config.conf.get("gs", {{}}).get("token") == "anon", fsspec.config.conf
            fs = fsspec.filesystem({server.protocol!r}, skip_instance_cache=True)
            print(fs.cat({path!r}).decode())
            """
        )
        prefixes = ("AWS_", "AZURE_", "GOOGLE_", "GCSFS_", "FSSPEC_", "STORAGE_EMULATOR_HOST")
        env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
        env.update(
            AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        )
        env.update(server.env)
        result = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "configured by env"
    finally:
        server.stop()


def test_a_server_that_exits_early_raises_an_error_naming_command_exit_code_and_output(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-c", "print('cannot serve today'); raise SystemExit(3)"]
    with pytest.raises(RuntimeError) as excinfo:
        _start(
            "s3",
            "s3",
            lambda port: command,
            lambda endpoint: False,
            lambda endpoint: ({}, {}),
            log_dir=tmp_path,
            timeout=10,
        )
    message = str(excinfo.value)
    assert "raise SystemExit(3)" in message
    assert "exit code: 3" in message
    assert "cannot serve today" in message


def test_stop_kills_a_server_that_ignores_sigterm_after_the_bound(tmp_path: Path) -> None:
    serve = (
        "import http.server, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), "
        "http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    server = _start(
        "s3",
        "s3",
        lambda port: [sys.executable, "-c", serve, str(port)],
        lambda endpoint: _http_status(endpoint) is not None,
        lambda endpoint: ({}, {}),
        log_dir=tmp_path,
        timeout=30,
    )
    started = time.monotonic()
    server.stop(timeout=1)
    assert time.monotonic() - started < 5
    assert _wait_gone(server.pid, 5)
    assert server._process.returncode == -signal.SIGKILL


def test_storage_options_are_a_fresh_copy_each_time(tmp_path: Path) -> None:
    server: StorageServer = start_server("s3", log_dir=tmp_path)
    try:
        options = server.storage_options
        options["client_kwargs"]["region_name"] = "changed"
        assert server.storage_options["client_kwargs"]["region_name"] != "changed"
    finally:
        server.stop()
