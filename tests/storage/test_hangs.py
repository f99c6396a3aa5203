"""A store that stops answering mid-transfer: the call raises within its bound, the old object stays.

Each test starts its own server (moto, fake-gcs-server or Azurite) and freezes its whole
process group with SIGSTOP from the progress callback, once the transfer is under way: the
kernel still accepts connections and buffers requests, so every request simply never gets an
answer, the way a hung server or a black-holed route behaves. Before the overall deadline
(``transfer_timeout``) a save waited for more than ten minutes there whatever the per-request
timeouts said (issue 13, item 8).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint
from flyte_checkpoint.errors import CheckpointTimeoutError
from flyte_checkpoint.storage import backend_for
from flyte_checkpoint.storage.deadline import ABORT_SECONDS
from tests.storage.conftest import Remote, remote_for
from tests.storage_servers import StorageServer, start_azurite, start_fake_gcs, start_moto

TRANSFER_TIMEOUT = 4.0
BOUND = 60.0
"""Far below the test timeout and the ten minutes of the bug; well above the timeout plus the
bounded abort (the per-request timeouts of these options are 120 s and more)."""
_STARTERS: dict[str, Callable[..., StorageServer]] = {
    "s3": start_moto,
    "gcs": start_fake_gcs,
    "azure": start_azurite,
}


class Frozen:
    """A server of our own, frozen by :meth:`freeze` and thawed again at the end of the test."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self.frozen = False

    def freeze(self) -> None:
        if not self.frozen:
            self.frozen = True
            os.killpg(self.remote.server.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.frozen:
            self.frozen = False
            os.killpg(self.remote.server.pid, signal.SIGCONT)

    def options(self, **extra: Any) -> dict[str, Any]:
        return {**self.remote.storage_options, "transfer_timeout": TRANSFER_TIMEOUT, **extra}


@pytest.fixture(params=tuple(_STARTERS))
def own_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Frozen]:
    backend = str(request.param)
    server = _STARTERS[backend](log_dir=tmp_path / "server-log")
    frozen = Frozen(remote_for(backend, server))
    try:
        yield frozen
    finally:
        frozen.thaw()
        server.stop()


def _freezing_at_first_progress(frozen: Frozen) -> Callable[[int, int | None], None]:
    def progress(done: int, total: int | None) -> None:
        if done > 0:
            frozen.freeze()

    return progress


def test_a_save_to_a_store_that_stops_answering_times_out_and_keeps_the_old_object(
    own_server: Frozen, tmp_path: Path
) -> None:
    remote = own_server.remote
    old = os.urandom(1 << 20)
    Checkpoint(remote.uri("ckpt"), storage_options=remote.storage_options).save_sync(old)
    big = tmp_path / "new.bin"
    big.write_bytes(os.urandom(40 << 20))  # reported every MiB: frozen long before the commit
    cp = Checkpoint(remote.uri("ckpt"), storage_options=own_server.options())
    started = time.monotonic()
    with pytest.raises(CheckpointTimeoutError, match="transfer_timeout"):
        cp.save_sync(big, progress=_freezing_at_first_progress(own_server))
    assert time.monotonic() - started < BOUND
    assert own_server.frozen
    own_server.thaw()
    restored = Checkpoint(
        tmp_path / "out", remote.uri("ckpt"), storage_options=remote.storage_options
    ).load_sync()
    assert restored is not None
    assert restored.read_bytes() == old


def test_a_load_from_a_store_that_stops_answering_times_out(own_server: Frozen, tmp_path: Path) -> None:
    remote = own_server.remote
    data = os.urandom(40 << 20)
    Checkpoint(remote.uri("ckpt"), storage_options=remote.storage_options).save_sync(data)
    # One 5 MiB range at a time on S3: what is left is asked for after the freeze.
    options = own_server.options(max_concurrency=1, part_size=5 << 20)
    cp = Checkpoint(tmp_path / "out", remote.uri("ckpt"), storage_options=options)
    started = time.monotonic()
    with pytest.raises(CheckpointTimeoutError, match="transfer_timeout"):
        cp.load_sync(progress=_freezing_at_first_progress(own_server))
    assert time.monotonic() - started < BOUND
    assert own_server.frozen
    own_server.thaw()
    again = Checkpoint(tmp_path / "again", remote.uri("ckpt"), storage_options=remote.storage_options)
    restored = again.load_sync()
    assert restored is not None
    assert restored.read_bytes() == data


def test_an_inspection_of_a_store_that_stopped_answering_times_out(own_server: Frozen) -> None:
    remote = own_server.remote
    backend = backend_for(remote.uri("ckpt"), own_server.options())
    # The client is built and connected. The first call imports and builds it, which on a loaded
    # machine (a fresh clone has no bytecode cache) can outlast the short bound: it is asked again.
    for attempt in range(3):
        try:
            assert backend.info(remote.uri("ckpt")) is None
            break
        except CheckpointTimeoutError:
            if attempt == 2:
                raise
    own_server.freeze()
    started = time.monotonic()
    with pytest.raises(CheckpointTimeoutError):
        backend.info(remote.uri("ckpt"))
    assert time.monotonic() - started < BOUND


def test_the_bound_without_a_transfer_timeout_grows_with_the_bytes_moved() -> None:
    from flyte_checkpoint.storage.deadline import BASE_SECONDS, SECONDS_PER_MIB, TransferBound

    deadline = TransferBound("s3://b/k", "saving", loop=None)
    assert deadline.seconds == BASE_SECONDS
    deadline.allow_for(100 << 20)
    assert deadline.seconds == BASE_SECONDS + 100 * SECONDS_PER_MIB
    assert TransferBound("s3://b/k", "saving", loop=None, seconds=5).seconds == 5
    assert deadline.abort_seconds() == ABORT_SECONDS
