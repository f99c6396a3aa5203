"""Cloud preemption notices (AWS Spot, GCE, Azure Scheduled Events) against a loopback metadata
service that speaks each protocol as documented (tests/preemption/metadata_servers.py)."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import (
    CLOUD_NOTICES_ENV,
    PreemptionNotice,
    install_preemption_handler,
    notice,
    watch_cloud_notices,
)
from flyte_checkpoint.preemption.cloud import ENDPOINT_ENVS
from tests.preemption.metadata_servers import (
    AWS_ACTION_PATH,
    AWS_TOKEN_PATH,
    AZURE_EVENTS_PATH,
    GCE_PREEMPTED_PATH,
    MetadataServer,
    metadata_server,
)

FAST = 0.05
"""Poll interval for the tests (the clouds recommend 1 s to 5 s)."""


@pytest.fixture(autouse=True)
def no_notice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends without a notice, and with no cloud configured by the shell."""
    for name in (CLOUD_NOTICES_ENV, *ENDPOINT_ENVS.values()):
        monkeypatch.delenv(name, raising=False)
    notice.clear()
    yield
    notice.clear()


def wait_for(condition: Callable[[], object], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


@contextmanager
def watched(cloud: str, poll_seconds: float = FAST) -> Iterator[MetadataServer]:
    """A loopback service speaking ``cloud``'s protocol and a watcher of it, both ended on leaving."""
    with (
        metadata_server(cloud) as server,
        watch_cloud_notices(cloud, poll_seconds=poll_seconds, base_urls={cloud: server.url}),
    ):
        yield server


def notified() -> bool:
    return wait_for(lambda: notice.current_notice() is not None)


def recorded() -> PreemptionNotice:
    current = notice.current_notice()
    assert current is not None, "no preemption notice was recorded"
    return current


def cloud_threads() -> list[threading.Thread]:
    return [each for each in threading.enumerate() if each.name.startswith("flyte-checkpoint-aws")]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# -- AWS ----------------------------------------------------------------------------------------


def test_an_aws_spot_interruption_becomes_the_notice_with_the_time_left_until_the_announced_time() -> None:
    with watched("aws") as server:
        assert wait_for(lambda: server.state.answered(AWS_ACTION_PATH, 404))
        server.state.announce_aws("terminate", 90)
        assert notified()

    current = recorded()
    assert (current.source, current.signal) == ("aws-spot", None)
    assert 87 < current.grace_seconds <= 90  # the announced time is given to the second


def test_an_expired_aws_token_is_replaced_after_its_401() -> None:
    with watched("aws") as server:
        assert wait_for(lambda: server.state.answered(AWS_ACTION_PATH, 404))
        server.state.expire_tokens()
        server.state.announce_aws("stop", 60)
        assert notified()

    assert server.state.answered(AWS_ACTION_PATH, 401)
    assert len(server.state.answered(AWS_TOKEN_PATH, 200)) == 2
    assert recorded().source == "aws-spot"


def test_an_aws_hibernation_is_not_a_preemption_since_the_process_resumes_with_the_instance() -> None:
    with watched("aws") as server:
        server.state.announce_aws("hibernate", 0)
        assert wait_for(lambda: len(server.state.answered(AWS_ACTION_PATH, 200)) >= 3)

    assert notice.current_notice() is None


# -- GCE ----------------------------------------------------------------------------------------


def test_a_gce_preemption_arrives_through_the_long_poll_with_the_documented_30_seconds() -> None:
    # Polling every 30 s, only the long-poll can bring the notice within seconds.
    with watched("gce", poll_seconds=30) as server:
        assert wait_for(lambda: server.state.answered(GCE_PREEMPTED_PATH, 200))
        time.sleep(0.2)  # the long-poll is held by now
        server.state.preempt_gce()
        assert wait_for(lambda: notice.current_notice() is not None, within=3)

    assert (recorded().source, recorded().grace_seconds) == ("gce-preempted", 30.0)
    first, delivering = server.state.answered(GCE_PREEMPTED_PATH, 200)[:2]
    assert "wait_for_change" not in first.query
    assert delivering.query["wait_for_change"] == ["true"]
    assert delivering.query["last_etag"]
    assert not server.state.answered(GCE_PREEMPTED_PATH, 403)  # every request said Metadata-Flavor: Google


# -- Azure --------------------------------------------------------------------------------------


def test_an_azure_preempt_event_for_this_vm_becomes_the_notice_with_the_time_until_not_before() -> None:
    with watched("azure") as server:
        assert wait_for(lambda: server.state.answered(AZURE_EVENTS_PATH, 200))
        server.state.schedule_azure("Preempt", 45)
        assert notified()

    current = recorded()
    assert current.source == "azure-scheduled-event"
    assert 42 < current.grace_seconds <= 45
    assert not server.state.answered(AZURE_EVENTS_PATH, 400)  # every request said Metadata: true


def test_azure_events_other_than_a_preempt_of_this_vm_are_ignored() -> None:
    with watched("azure") as server:
        server.state.schedule_azure("Reboot", 20, event_id="reboot")
        server.state.schedule_azure("Freeze", 20, event_id="freeze")
        server.state.schedule_azure("Preempt", 20, resources=["trainer_4"], event_id="a-neighbour")
        asked = len(server.state.answered(AZURE_EVENTS_PATH, 200))
        assert wait_for(lambda: len(server.state.answered(AZURE_EVENTS_PATH, 200)) >= asked + 3)

    assert notice.current_notice() is None


# -- every cloud --------------------------------------------------------------------------------


def test_no_notice_is_recorded_while_no_cloud_announces_one() -> None:
    with metadata_server("aws", "gce", "azure") as server:
        urls = dict.fromkeys(("aws", "gce", "azure"), server.url)
        with watch_cloud_notices("auto", poll_seconds=FAST, base_urls=urls) as watcher:
            assert wait_for(lambda: len(server.state.answered(AWS_ACTION_PATH, 404)) >= 3)
            assert wait_for(lambda: len(server.state.answered(AZURE_EVENTS_PATH, 200)) >= 3)
            assert server.state.answered(GCE_PREEMPTED_PATH, 200)
            assert watcher.watching == ("aws", "gce", "azure")

    assert notice.current_notice() is None


def test_a_service_that_does_not_answer_is_dropped_after_a_few_tries_in_one_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="flyte_checkpoint")
    unreachable = f"http://127.0.0.1:{closed_port()}"
    with watch_cloud_notices("aws", poll_seconds=FAST, base_urls={"aws": unreachable}) as watcher:
        assert wait_for(lambda: watcher.watching == ())

    lines = [record for record in caplog.records if record.name == "flyte_checkpoint"]
    assert [record.levelno for record in lines] == [logging.DEBUG]
    assert "aws metadata service" in lines[0].getMessage()
    assert notice.current_notice() is None


def test_auto_keeps_watching_only_the_cloud_whose_service_answers() -> None:
    with metadata_server("azure") as server:
        urls = dict.fromkeys(("aws", "gce", "azure"), server.url)
        with watch_cloud_notices("auto", poll_seconds=FAST, base_urls=urls) as watcher:
            assert wait_for(lambda: watcher.watching == ("azure",))
            server.state.schedule_azure("Preempt", 40)
            assert notified()

    assert recorded().source == "azure-scheduled-event"


def test_a_notice_cleared_for_another_attempt_is_recorded_again_while_the_cloud_still_announces_it() -> None:
    with watched("aws") as server:
        server.state.announce_aws("terminate", 100)
        assert notified()
        first = recorded()
        notice.clear()
        assert notified()

    assert recorded() is not first
    assert recorded().source == "aws-spot"


def test_endpoints_come_from_the_environment_when_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    with metadata_server("aws") as server:
        monkeypatch.setenv(ENDPOINT_ENVS["aws"], server.url)
        server.state.announce_aws("terminate", 100)
        with watch_cloud_notices("aws", poll_seconds=FAST):
            assert notified()

    assert recorded().source == "aws-spot"


def test_an_unknown_cloud_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"'ibm'.*aws, gce, azure"):
        watch_cloud_notices("aws,ibm")


@pytest.mark.parametrize("poll_seconds", [0, -1, float("inf"), True])
def test_a_poll_interval_that_is_not_a_finite_positive_number_is_a_configuration_error(
    poll_seconds: float,
) -> None:
    with pytest.raises(ConfigurationError, match="poll_seconds"):
        watch_cloud_notices("aws", poll_seconds=poll_seconds)


# -- stopping -----------------------------------------------------------------------------------


def test_stop_ends_the_threads_even_during_a_gce_long_poll() -> None:
    with metadata_server("gce") as server:
        watcher = watch_cloud_notices("gce", poll_seconds=FAST, base_urls={"gce": server.url})
        assert wait_for(lambda: server.state.answered(GCE_PREEMPTED_PATH, 200))
        time.sleep(0.2)  # the long-poll (60 s) is held by now

        started = time.monotonic()
        watcher.stop()

        assert time.monotonic() - started < 2
        assert watcher.watching == ()


def test_leaving_the_with_block_stops_the_watcher() -> None:
    with metadata_server("aws") as server:
        with watch_cloud_notices("aws", poll_seconds=FAST, base_urls={"aws": server.url}) as watcher:
            assert watcher.watching == ("aws",)

        assert not watcher.watching


# -- through install_preemption_handler ---------------------------------------------------------


def test_the_handler_watches_the_clouds_named_in_the_environment_until_its_last_uninstall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with metadata_server("aws") as server:
        monkeypatch.setenv(CLOUD_NOTICES_ENV, "aws")
        monkeypatch.setenv(ENDPOINT_ENVS["aws"], server.url)
        server.state.announce_aws("terminate", 100)

        outer = install_preemption_handler(end_main_thread=False)
        try:
            inner = install_preemption_handler(end_main_thread=False)
            assert notified()
            inner.uninstall()
            assert [each.is_alive() for each in cloud_threads()] == [True]
        finally:
            outer.uninstall()

        assert cloud_threads() == []
        assert recorded().source == "aws-spot"


def test_a_malformed_cloud_list_in_the_environment_fails_the_install_before_anything_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CLOUD_NOTICES_ENV, "aws,ibm")
    before = signal.getsignal(signal.SIGTERM)

    with pytest.raises(ConfigurationError, match=CLOUD_NOTICES_ENV):
        install_preemption_handler()

    assert signal.getsignal(signal.SIGTERM) is before
