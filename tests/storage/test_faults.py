"""Transient faults between us and each object store, injected by a proxy on loopback.

The proxy (tests/faults/proxy.py) sits in front of the real emulator and answers 503s, drops
connections mid-request or stalls, on demand. The client options give every call a short time
bound and little backend-level retrying, so each test runs in seconds. gcsfs retries every
request 6 times with up to 32 s of back-off and offers no switch (a refused connection takes about
100 s to fail there, bounded but slow), so the tests whose fault never clears run on S3 and Azure;
GCS's time bound (``requests_timeout``, not retried) is covered by the stall test.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointError, CheckpointUnavailableError
from flyte_checkpoint.cli import main
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.storage.stores.s3 import S3Object
from tests.faults.proxy import FaultProxy, drop_mid_request, drop_mid_response, stall, status
from tests.storage.conftest import Remote

QUICK_RETRY = RetryPolicy(attempts=3, initial_delay=0.05, max_delay=0.2)
_WRITE_METHODS = {"s3": "PUT", "gcs": "POST", "azure": "PUT"}


def options_through(remote: Remote, proxy: FaultProxy) -> dict[str, Any]:
    """The remote's options, pointed at ``proxy``, with short time bounds and backend retries."""
    options = remote.storage_options
    if remote.backend == "s3":
        options["endpoint_url"] = proxy.url
        options["config_kwargs"] = {
            "connect_timeout": 1,
            "read_timeout": 2,
            "retries": {"max_attempts": 1, "mode": "standard"},
        }
        options["retries"] = 1
    elif remote.backend == "gcs":
        options["endpoint_url"] = proxy.url
        options["requests_timeout"] = 2
    else:
        options["connection_string"] = options["connection_string"].replace(remote.server.endpoint, proxy.url)
        options.update(retry_total=0, retry_backoff=0.05, connection_timeout=1, read_timeout=2)
    return options


@pytest.fixture
def proxy(remote: Remote) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", remote.server.port)) as running:
        yield running


def through_proxy(remote: Remote, proxy: FaultProxy, dest: str, src: str | None = None) -> Checkpoint:
    return Checkpoint(
        remote.uri(dest),
        remote.uri(src) if src else None,
        storage_options=options_through(remote, proxy),
        retry=QUICK_RETRY,
    )


def direct(remote: Remote, dest: str, src: str | None = None) -> Checkpoint:
    return Checkpoint(
        remote.uri(dest), remote.uri(src) if src else None, storage_options=remote.storage_options
    )


def test_a_save_retries_through_503s_and_lands(remote: Remote, proxy: FaultProxy) -> None:
    proxy.add_fault(status(503, retry_after=0), times=2, method=_WRITE_METHODS[remote.backend])
    through_proxy(remote, proxy, "flaky-save").save_sync(b"made it through")
    assert sum(1 for r in proxy.requests if r.status == 503) == 2
    restored = direct(remote, "unused", "flaky-save").load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"made it through"


def test_a_load_retries_through_503s_and_restores(remote: Remote, proxy: FaultProxy) -> None:
    direct(remote, "flaky-load").save_sync(b"worth waiting for")
    proxy.add_fault(status(503, retry_after=0), times=2, method="GET")
    restored = through_proxy(remote, proxy, "unused", "flaky-load").load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"worth waiting for"


def test_the_get_command_retries_through_a_503_and_restores(
    remote: Remote, proxy: FaultProxy, tmp_path: Path
) -> None:
    direct(remote, "flaky-get").save_sync(b"fetched by the command")
    proxy.add_fault(status(503, retry_after=0), times=2, method="GET")
    flags = []
    for key, value in options_through(remote, proxy).items():
        flags += ["-o", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    assert main(["get", *flags, remote.uri("flaky-get"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "payload").read_bytes() == b"fetched by the command"
    assert sum(1 for r in proxy.requests if r.status == 503) == 2


@pytest.mark.parametrize("remote", ["s3"], indirect=True)
def test_an_s3_load_cut_off_mid_body_resumes_where_it_stopped(
    remote: Remote, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = os.urandom(900 << 10)  # within a load's first GET (sizing.FIRST_RANGE): one range
    direct(remote, "cut-off").save_sync(payload)
    get_range, resumed_at = S3Object.get_range, []

    async def recording(self: S3Object, start: int, length: int, version: str | None) -> Any:
        resumed_at.append(start)
        return await get_range(self, start, length, version)

    monkeypatch.setattr(S3Object, "get_range", recording)
    # The pause lets the client read what was relayed before the reset, even on a loaded machine.
    proxy.add_fault(drop_mid_response(512 << 10, pause=1.0), times=1, method="GET")
    restored = through_proxy(remote, proxy, "unused", "cut-off").load_sync()
    assert restored is not None
    assert restored.read_bytes() == payload
    # The range was reopened at the offset reached (one more ranged GET), not read again whole.
    assert [r.upstream_status for r in proxy.requests if r.method == "GET"] == [206, 206]
    assert len(resumed_at) == 1
    assert 0 < resumed_at[0] <= 512 << 10


@pytest.mark.parametrize("remote", ["s3", "azure"], indirect=True)
def test_a_store_that_keeps_failing_raises_unavailable_instead_of_none(
    remote: Remote, proxy: FaultProxy
) -> None:
    direct(remote, "down").save_sync(b"exists, but cannot be reached")
    proxy.add_fault(status(503, retry_after=0), times=None)
    with pytest.raises(CheckpointUnavailableError, match="gave up loading"):
        through_proxy(remote, proxy, "unused", "down").load_sync()


@pytest.mark.parametrize("remote", ["s3", "azure"], indirect=True)
def test_an_upload_dropped_mid_request_leaves_the_previous_object_intact(
    remote: Remote, proxy: FaultProxy
) -> None:
    direct(remote, "survivor").save_sync(b"the good checkpoint")
    proxy.add_fault(drop_mid_request(4096), times=None, method="PUT")
    with pytest.raises(CheckpointError):
        through_proxy(remote, proxy, "survivor").save_sync(bytes(range(256)) * 40_000)
    restored = direct(remote, "unused", "survivor").load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"the good checkpoint"


def test_a_stalled_store_hits_the_time_bound(remote: Remote, proxy: FaultProxy) -> None:
    direct(remote, "stalled").save_sync(b"behind a stall")
    proxy.add_fault(stall(60), times=None)
    started = time.monotonic()
    with pytest.raises(CheckpointUnavailableError):
        through_proxy(remote, proxy, "unused", "stalled").load_sync()
    assert time.monotonic() - started < 45


@pytest.mark.parametrize("remote", ["s3", "azure"], indirect=True)
def test_a_refused_connection_is_unavailable_not_absent(remote: Remote) -> None:
    with FaultProxy(upstream=("127.0.0.1", remote.server.port)) as closed:
        options = options_through(remote, closed)  # the proxy is gone: its port refuses
    cp = Checkpoint("unused", remote.uri("anything"), storage_options=options, retry=QUICK_RETRY)
    with pytest.raises(CheckpointUnavailableError):
        cp.load_sync()
