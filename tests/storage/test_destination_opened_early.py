"""The load that starts every task also makes the destination's client ready for the first save."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.faults.proxy import FaultProxy, RequestRecord, status
from tests.storage.conftest import Remote
from tests.storage.test_faults import through_proxy


@pytest.fixture
def proxy(remote: Remote) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", remote.server.port)) as running:
        yield running


def requests_naming(proxy: FaultProxy, name: str, within: float = 10.0) -> list[RequestRecord]:
    give_up = time.monotonic() + within
    while time.monotonic() < give_up:
        if found := [request for request in proxy.requests if name in request.path]:
            return found
        time.sleep(0.02)
    return []


def test_a_load_with_nothing_to_restore_opens_the_destination_ahead_of_the_first_save(
    remote: Remote, proxy: FaultProxy
) -> None:
    helper = through_proxy(remote, proxy, "attempt-0/ckpt")
    assert requests_naming(proxy, "attempt-0", within=0.2) == []  # building the helper asks nothing
    assert helper.load_sync() is None
    assert requests_naming(proxy, "attempt-0") != []
    helper.close()


def test_a_destination_that_fails_early_leaves_the_load_and_the_save_to_report_for_themselves(
    remote: Remote, proxy: FaultProxy
) -> None:
    proxy.add_fault(status(403), times=1)
    helper = through_proxy(remote, proxy, "attempt-0/ckpt")
    assert helper.load_sync() is None  # the refused early request is only logged
    assert requests_naming(proxy, "attempt-0") != []
    helper.save_sync(b"state")
    helper.close()
