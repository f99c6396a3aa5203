"""Bounded retries of transient storage failures, and that they never turn into "no checkpoint"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flyte_checkpoint import Checkpoint, CheckpointStorageError, CheckpointUnavailableError
from flyte_checkpoint.errors import describe_error
from flyte_checkpoint.storage.base import Backend
from flyte_checkpoint.storage.retry import RetryPolicy

FAST = RetryPolicy(attempts=4, initial_delay=0.001, max_delay=0.002)


class Flaky:
    """Fails with ``error`` the first ``failures`` calls, then returns ``"done"``."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_a_transient_failure_is_retried_until_it_succeeds() -> None:
    operation = Flaky(3, CheckpointUnavailableError("connection reset"))
    assert FAST.call(operation, describe="loading x") == "done"
    assert operation.calls == 4


def test_retries_give_up_after_the_configured_attempts_with_a_clear_error() -> None:
    operation = Flaky(10, CheckpointUnavailableError("connection refused"))
    with pytest.raises(CheckpointUnavailableError, match="gave up loading x after 4 attempts"):
        FAST.call(operation, describe="loading x")
    assert operation.calls == 4


def test_a_permanent_failure_is_not_retried() -> None:
    operation = Flaky(10, CheckpointStorageError("disk full"))
    with pytest.raises(CheckpointStorageError):
        FAST.call(operation, describe="saving x")
    assert operation.calls == 1


def test_waits_grow_but_stay_under_the_cap() -> None:
    policy = RetryPolicy(attempts=10, initial_delay=0.5, max_delay=2.0)
    waits: list[float] = []
    with pytest.raises(CheckpointUnavailableError):
        policy.call(Flaky(99, CheckpointUnavailableError("down")), describe="x", sleep=waits.append)
    assert len(waits) == 9
    assert all(0 <= wait <= 2.0 for wait in waits)
    assert max(waits[:1]) <= 0.5


def break_reads(monkeypatch: pytest.MonkeyPatch, backend: Backend, failures: int) -> Flaky:
    """Fault injection: the backend's first ``failures`` opens fail as a network blip would."""
    original = backend.open_read
    counter = Flaky(failures, CheckpointUnavailableError("connection reset by peer"))

    def flaky_open(uri: str, **options: Any) -> Any:
        counter()
        return original(uri, **options)

    monkeypatch.setattr(backend, "open_read", flaky_open)
    return counter


def test_a_load_that_hits_a_network_blip_retries_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"progress")
    cp = Checkpoint("unused", str(tmp_path / "obj"), retry=FAST)
    assert cp._src_backend is not None
    break_reads(monkeypatch, cp._src_backend, failures=2)
    restored = cp.load_sync()
    assert restored is not None
    assert restored.read_bytes() == b"progress"


def test_a_load_that_never_reaches_storage_raises_instead_of_returning_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Checkpoint(str(tmp_path / "obj")).save_sync(b"progress")
    cp = Checkpoint("unused", str(tmp_path / "obj"), retry=FAST)
    assert cp._src_backend is not None
    counter = break_reads(monkeypatch, cp._src_backend, failures=100)
    with pytest.raises(CheckpointUnavailableError, match="may still exist"):
        cp.load_sync()
    assert counter.calls == 4
    assert list(cp.path.iterdir()) == []


def test_giving_up_raises_the_last_error_itself_with_the_attempt_count_as_a_note() -> None:
    class Throttled(CheckpointUnavailableError):
        pass

    last = Throttled("slow down")
    with pytest.raises(Throttled) as caught:
        FAST.call(Flaky(10, last), describe="saving x")
    assert caught.value is last  # the class and the object stay; the count is context
    assert "gave up saving x after 4 attempts" in describe_error(caught.value)


def test_the_longest_back_off_of_the_default_policy_is_a_few_seconds() -> None:
    assert RetryPolicy().max_total_delay() == 0.25 + 0.5 + 1 + 2
