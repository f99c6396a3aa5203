"""The preemption handler with real processes and real signals: the one-line loop saves the step
after the notice, a task that does not handle it keeps its in-flight save, handlers chain."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import install_preemption_handler, notice
from tests.faults.signals.processes import Program, running
from tests.preemption.programs import step_of

PROGRAMS = "tests.preemption.programs"


def steps_done(program: Program) -> int:
    return max((int(line.split()[1]) for line in program.lines if line.startswith("step ")), default=0)


def saved_step(dest: Path) -> int:
    return step_of(dest.read_bytes())


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1"])
def test_the_one_line_loop_saves_the_step_after_the_notice_and_exits_with_the_signals_status(
    signame: str, tmp_path: Path
) -> None:
    dest = tmp_path / "ckpt"
    with running(["one-line", str(dest), "--signal", signame], module=PROGRAMS) as program:
        program.wait_for_line("step 7")
        program.send(signal.Signals[signame])
        status = program.finish()
    assert status == 128 + signal.Signals[signame], program.output()
    assert saved_step(dest) == steps_done(program)  # no step lost


def test_the_next_attempt_resumes_from_the_step_saved_at_the_notice(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    with running(["one-line", str(dest)], module=PROGRAMS) as first:
        first.wait_for_line("step 5")
        first.send(signal.SIGTERM)
        first.finish()
    with running(["one-line", str(dest), "--steps", "0"], module=PROGRAMS) as second:
        assert second.finish() == 0
    assert f"resumed {steps_done(first)}" in second.lines


def test_a_task_that_never_reads_preempted_keeps_its_background_save_in_flight(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    argv = ["zero-code", str(dest), "--state-mib", "256"]
    with running(argv, module=PROGRAMS) as program:
        program.wait_for_line("saving 20")
        program.send(signal.SIGTERM)  # the 256 MiB upload has only just started
        status = program.finish()
    assert status == 143, program.output()
    started = [int(line.split()[1]) for line in program.lines if line.startswith("saving ")]
    assert saved_step(dest) == max(started)  # the newest save started was not thrown away
    assert "ends once the saves in flight have committed" in program.output()


def test_a_task_that_never_reads_preempted_and_saves_nothing_is_ended_promptly(tmp_path: Path) -> None:
    with running(["zero-code", str(tmp_path / "ckpt")], module=PROGRAMS) as program:
        program.wait_for_line("step 3")
        program.send(signal.SIGTERM)
        status = program.finish()
    assert status == 143, program.output()
    assert steps_done(program) < 60  # 3 s of 50 ms steps, on a loaded machine; the grace is 10 s


def test_a_handler_installed_before_is_called_on_the_signal_and_restored_afterwards() -> None:
    calls: list[int] = []

    def users_handler(signum: int, frame: object) -> None:
        calls.append(signum)

    before = signal.signal(signal.SIGTERM, users_handler)
    try:
        with install_preemption_handler(grace_seconds=30, end_main_thread=False):
            signal.raise_signal(signal.SIGTERM)
            recorded = notice.current_notice()
            assert recorded is not None
            assert recorded.source == "SIGTERM"
            assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is users_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_nested_installations_share_the_handler_until_the_last_is_uninstalled() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    outer = install_preemption_handler([signal.SIGUSR2], end_main_thread=False)
    inner = install_preemption_handler([signal.SIGUSR2], end_main_thread=False)
    inner.uninstall()
    assert signal.getsignal(signal.SIGUSR2) is not before
    outer.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_installing_outside_the_main_thread_installs_nothing() -> None:
    handles = []
    worker = threading.Thread(target=lambda: handles.append(install_preemption_handler()))
    worker.start()
    worker.join()
    assert handles[0].installed is False


def test_a_value_that_is_no_signal_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="is not a signal"):
        install_preemption_handler([12345])
