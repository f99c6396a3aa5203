"""The save deadline keeps the time the process needs to exit: a final save that cannot commit in
time is refused early enough for the process to exit by itself before the SIGKILL, however slow
its exit path (here an atexit hook). A supervisor sends SIGTERM and, G seconds later, SIGKILL, as
the kubelet does."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import install_preemption_handler, notice
from tests.faults.signals.processes import Program, running


def preempted_with_sigkill_at(
    grace: float, tmp_path: Path, inputs: Mapping[str, object], environment: Mapping[str, str] | None = None
) -> tuple[int, Program]:
    """``flyte-checkpoint run`` of :func:`tests.runner_programs.save_slowly_on_notice`, sent SIGTERM
    when ready and SIGKILL ``grace`` seconds later unless it exited first; its exit status."""
    argv = ["run", "--checkpoint-path", str(tmp_path / "cur"), "--grace-seconds", str(grace)]
    argv += ["--inputs", json.dumps(dict(inputs)), "tests.runner_programs:save_slowly_on_notice"]
    with running(argv, module="flyte_checkpoint", environment=environment) as program:
        program.wait_for_line("ready")
        program.send(signal.SIGTERM)
        return program.finish_or_kill(time.monotonic() + grace), program


def test_a_slow_atexit_hook_given_as_the_exit_time_exits_before_the_sigkill(tmp_path: Path) -> None:
    exit_time = {"FLYTE_CHECKPOINT_EXIT_SECONDS": "1.5"}  # 0.4 s, teardown, and room for a busy machine
    status, program = preempted_with_sigkill_at(3.0, tmp_path, {"linger_seconds": 0.4}, exit_time)
    assert status == 128 + signal.SIGTERM, program.output()
    assert "exiting" in program.output()
    assert "PreemptionDeadlineError" in program.output()  # the save was refused, not cut off


def test_the_exit_time_is_estimated_from_what_the_process_holds_while_a_handler_is_installed() -> None:
    with install_preemption_handler(grace_seconds=30):
        recorded = notice.notify_signal(signal.SIGTERM, 30.0)
    assert recorded.exit_seconds >= notice.EXIT_BASE_SECONDS + notice.EXIT_SECONDS_PER_BLOCK * 100_000
    assert recorded.exit_seconds <= notice.estimated_exit_seconds() * 1.5  # the estimate, as of the notice
    notice.clear()
    assert notice.notify_signal(signal.SIGTERM, 30.0).exit_seconds == 0.0  # no handler: no process exit


def test_a_given_exit_time_replaces_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notice.EXIT_SECONDS_ENV, "0.7")
    with install_preemption_handler(grace_seconds=30):
        assert notice.notify_signal(signal.SIGTERM, 2.0).margin == pytest.approx(0.7)


def test_the_margin_keeps_the_exit_time_but_never_more_than_half_the_grace_period() -> None:
    assert notice.safety_margin(2.0, 0.7) == pytest.approx(0.7)
    assert notice.safety_margin(1.0, 0.8) == pytest.approx(0.5)
    assert notice.safety_margin(30.0, 0.8) == pytest.approx(3.0)  # a tenth of G is still the floor


@pytest.mark.parametrize("raw", ["-1", "soon", "inf"])
def test_an_exit_time_that_is_not_a_number_of_seconds_is_refused_at_install(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(notice.EXIT_SECONDS_ENV, raw)
    with pytest.raises(ConfigurationError, match=notice.EXIT_SECONDS_ENV):
        install_preemption_handler(grace_seconds=30)


def test_a_busy_machine_stretches_the_exit_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    notice.refresh_load_factor()
    idle = notice.estimated_exit_seconds()
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cpus, 0.0, 0.0))  # three runnable tasks a CPU
    notice.refresh_load_factor()
    try:
        assert notice.estimated_exit_seconds() == pytest.approx(3 * idle, rel=0.05)
    finally:
        monkeypatch.undo()
        notice.refresh_load_factor()
