"""The final save after a notice never deadlocks with a background save that is committing.

The outside kubelet harness's deadlock on S3: a background save had written its last byte and
taken its commit turn while its last parts still waited to start; the final save at the notice
paused those parts and then waited for the turn. Each waited for the other until the SIGKILL.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, PreemptionDeadlineError
from flyte_checkpoint.preemption import notice
from flyte_checkpoint.storage.deadline import finish_by
from flyte_checkpoint.timebounds import Deadline
from tests.faults.proxy import FaultProxy, stall
from tests.storage_servers import StorageServer, create_bucket

MiB = 1024 * 1024
STATE = bytes(range(256)) * (20 * MiB // 256)  # three 8 MiB parts: a multipart upload


@pytest.fixture
def s3_proxy(s3_server: StorageServer) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", s3_server.port)) as running:
        yield running


def through_the_proxy(s3_server: StorageServer, s3_proxy: FaultProxy) -> tuple[str, dict[str, Any]]:
    """A destination in a new bucket, and the storage options that reach it through the proxy."""
    return f"s3://{create_bucket(s3_server)}/ckpt", {
        **s3_server.storage_options,
        "endpoint_url": s3_proxy.url,
    }


def wait_for_request(proxy: FaultProxy, fragment: str) -> None:
    """Until a request whose target holds ``fragment`` has reached the proxy."""
    while not any(fragment in record.path for record in proxy.requests):
        threading.Event().wait(0.01)


def returned_within(seconds: float, call: Callable[[], object]) -> list[object]:
    """Run ``call`` in a thread; its result, in a list, if it returned within ``seconds``, else []."""
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    return results


def stored(uri: str, options: dict[str, Any], tmp_path: Path) -> bytes:
    with Checkpoint(tmp_path / "reader", uri, storage_options=options) as reader:
        restored = reader.load_sync()
        assert restored is not None
        return restored.read_bytes()


def test_the_final_save_commits_while_a_background_save_waits_on_its_last_parts_on_s3(
    tmp_path: Path, s3_server: StorageServer, s3_proxy: FaultProxy
) -> None:
    uri, options = through_the_proxy(s3_server, s3_proxy)
    # The upload's creation answers late, so every part of the background save is still waiting
    # to start when its writer has taken the last byte and goes on to commit.
    s3_proxy.add_fault(stall(1.5, forward=True), method="POST", path_contains="uploads")
    helper = Checkpoint(uri, storage_options=options)
    helper.save_sync(STATE, background=True)
    wait_for_request(s3_proxy, "uploads")
    threading.Event().wait(0.3)  # the writer is past its last write, committing
    notice.notify_signal(signal.SIGTERM, 20.0)
    final = returned_within(10, lambda: helper.save_sync(b"final state"))
    assert final, "the final save deadlocked with the background save committing"
    notice.clear()
    helper.close()
    assert stored(uri, s3_server.storage_options, tmp_path) == b"final state"


def test_a_background_upload_the_final_save_superseded_stops_at_once_instead_of_finishing_its_parts(
    tmp_path: Path, s3_server: StorageServer, s3_proxy: FaultProxy
) -> None:
    uri, options = through_the_proxy(s3_server, s3_proxy)
    # Every part of the background save answers only after 15 s: they are still in flight when
    # the final save has committed, and that upload can no longer commit.
    s3_proxy.add_fault(stall(15.0, forward=True), times=None, method="PUT", path_contains="partNumber")
    helper = Checkpoint(uri, storage_options=options)
    helper.save_sync(STATE, background=True)
    wait_for_request(s3_proxy, "partNumber")
    notice.notify_signal(signal.SIGTERM, 30.0)
    helper.save_sync(b"final state")  # small: one PUT, not stalled
    # Waiting for the doomed parts took until they answered (15 s).
    ending = returned_within(8, helper.preemption)
    assert ending, "preemption() waited for an upload that can no longer commit"
    notice.clear()
    s3_proxy.clear_faults()
    helper.close()
    assert len(ending) == 1
    assert "committed" in str(ending[0])
    assert stored(uri, s3_server.storage_options, tmp_path) == b"final state"


def test_a_save_stopped_by_its_deadline_does_not_wait_for_its_abort_into_the_sigkill(
    tmp_path: Path, s3_server: StorageServer, s3_proxy: FaultProxy
) -> None:
    uri, options = through_the_proxy(s3_server, s3_proxy)
    s3_proxy.add_fault(stall(15.0, forward=True), times=None, method="PUT", path_contains="partNumber")
    s3_proxy.add_fault(stall(15.0, forward=True), times=None, method="DELETE", path_contains="uploadId")
    helper = Checkpoint(uri, storage_options=options)
    began = time.monotonic()
    deadline = Deadline.until(
        began + 1.0, reason="the test's save deadline", error_type=PreemptionDeadlineError
    )
    with finish_by(deadline), pytest.raises(PreemptionDeadlineError):
        helper.save_sync(STATE)
    # The abort used to be waited for 5 s at least, past the deadline: into the SIGKILL.
    assert time.monotonic() - began < 4.0
    s3_proxy.clear_faults()
    helper.close()
