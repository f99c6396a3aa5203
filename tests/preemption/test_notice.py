"""The notice: its grace period, its deadline, and which of two notices counts."""

from __future__ import annotations

import signal
import time

import pytest

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import notice


def test_the_grace_period_is_thirty_seconds_when_nothing_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(notice.GRACE_SECONDS_ENV, raising=False)
    assert notice.check_grace_seconds(None) == 30.0


def test_the_grace_period_comes_from_the_environment_when_no_argument_gives_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(notice.GRACE_SECONDS_ENV, "90")
    assert notice.check_grace_seconds(None) == 90.0
    assert notice.check_grace_seconds(12) == 12.0


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "inf", "nan"])
def test_a_malformed_grace_period_in_the_environment_is_a_configuration_error_naming_it(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(notice.GRACE_SECONDS_ENV, raw)
    with pytest.raises(ConfigurationError, match=notice.GRACE_SECONDS_ENV):
        notice.check_grace_seconds(None)


@pytest.mark.parametrize("value", [0, -1.0, True, "30"])
def test_a_grace_period_argument_that_is_not_positive_seconds_is_refused(value: object) -> None:
    with pytest.raises(ConfigurationError, match="grace_seconds"):
        notice.check_grace_seconds(value)  # type: ignore[arg-type]


def test_a_notice_records_its_deadline_and_the_time_left() -> None:
    recorded = notice.notify_signal(signal.SIGTERM, 30.0)
    assert recorded.source == "SIGTERM"
    assert recorded.deadline == pytest.approx(recorded.received_at + 30.0)
    assert 29.0 < recorded.time_left() <= 30.0
    assert notice.current_notice() is recorded


def test_a_later_notice_counts_only_when_its_deadline_is_sooner() -> None:
    first = notice.notify("aws-spot", 120.0)
    assert notice.notify_signal(signal.SIGTERM, 300.0) is first
    sooner = notice.notify_signal(signal.SIGTERM, 30.0)
    assert notice.current_notice() is sooner


def test_saves_must_finish_a_safety_margin_before_the_expected_sigkill() -> None:
    recorded = notice.notify_signal(signal.SIGTERM, 30.0)
    deadline = notice.save_deadline()
    assert deadline is not None
    assert recorded.deadline - deadline.at == pytest.approx(3.0)
    assert notice.safety_margin(2.0) == pytest.approx(0.2)
    assert notice.safety_margin(0.3) == pytest.approx(0.05)
    assert notice.safety_margin(0.1) == pytest.approx(0.025)  # never more than a quarter
    assert notice.safety_margin(600.0) == 5.0


def test_without_a_notice_there_is_no_save_deadline() -> None:
    assert notice.current_notice() is None
    assert notice.save_deadline() is None


def test_a_signal_arrival_dated_before_the_last_clear_is_not_a_notice_for_the_next_attempt() -> None:
    """The arrival watcher can run after the runner cleared the handled notice for a retry."""
    arrived = time.monotonic()
    notice.clear()  # the attempt that got the signal handled it; the next one starts
    notice.notify_arrival(signal.SIGTERM, 30.0, arrived)
    assert notice.current_notice() is None


def test_a_signal_arrival_after_the_last_clear_is_a_notice_dated_when_it_arrived() -> None:
    notice.clear()
    arrived = time.monotonic()
    notice.notify_arrival(signal.SIGTERM, 30.0, arrived)
    current = notice.current_notice()
    assert current is not None
    assert current.received_at == arrived
