"""A process forked from a task (a DataLoader worker, a multiprocessing pool) is not the task: it
gets back the signal handlers that were there before ours, so SIGTERM ends it as it always did,
and neither it nor its parent waits on the other at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="os.fork is POSIX's: there are no fork children on Windows"
)

TERMINATED_FORK_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from flyte_checkpoint import install_preemption_handler

    with install_preemption_handler(grace_seconds=30):
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        time.sleep(0.3)
        os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                how = "signalled" if os.WIFSIGNALED(status) else "exited"
                print(how, os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
                sys.exit(0)
            time.sleep(0.02)
        os.kill(child, signal.SIGKILL)
        print("still running")
    """
)

DAEMON_POOL_CHILD = textwrap.dedent(
    """
    import multiprocessing, time
    from flyte_checkpoint import install_preemption_handler

    def work():
        time.sleep(60)

    if __name__ == "__main__":
        install_preemption_handler(grace_seconds=30)
        worker = multiprocessing.get_context("fork").Process(target=work, daemon=True)
        worker.start()
        time.sleep(0.3)
        print("leaving", flush=True)
    """
)

SIGNALLED_CHILD_PARENT_NOTICE = textwrap.dedent(
    """
    import os, signal, sys, time
    from flyte_checkpoint.preemption import current_notice, install_preemption_handler

    with install_preemption_handler(grace_seconds=30):
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGINT, lambda *_: None)  # a Python handler: the wakeup fd is written
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.3)
        print("parent notice:", current_notice())
    """
)

CHILD_OF_A_NOTIFIED_PARENT = textwrap.dedent(
    """
    import os, signal, sys
    from flyte_checkpoint.preemption import install_preemption_handler, notice
    from flyte_checkpoint.preemption.state import STATE

    with install_preemption_handler(grace_seconds=30):
        notice.notify_signal(signal.SIGTERM, 30.0)
        notice.take_over()
        with notice.save_in_flight():
            child = os.fork()
            if child == 0:
                fresh = (
                    STATE.notice is None,
                    not STATE.taken_over,
                    STATE.saves_in_flight == 0,
                    STATE.handler.users == 0,
                    not STATE.handler.previous,
                    signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
                )
                os._exit(0 if all(fresh) else 1 + sum(1 << i for i, ok in enumerate(fresh) if not ok))
            _, status = os.waitpid(child, 0)
        parent = (STATE.notice is not None, STATE.handler.users)
        print("child:", os.waitstatus_to_exitcode(status), "parent:", *parent)
    """
)


def run(program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=False
    )


def test_sigterm_ends_a_fork_child_of_a_process_with_the_preemption_handler() -> None:
    result = run(TERMINATED_FORK_CHILD)
    assert result.stdout.strip() == "signalled 15", result.stderr


def test_a_process_with_a_daemon_fork_child_exits_without_hanging() -> None:
    result = run(DAEMON_POOL_CHILD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "leaving"


def test_a_signal_a_fork_child_receives_is_not_a_notice_for_its_parent() -> None:
    result = run(SIGNALLED_CHILD_PARENT_NOTICE)
    assert result.stdout.strip() == "parent notice: None", result.stderr


def test_a_fork_child_starts_with_fresh_preemption_state() -> None:
    # No notice, take-over, saves in flight or installation of its parent's; SIGTERM as before ours.
    result = run(CHILD_OF_A_NOTIFIED_PARENT)
    assert result.stdout.strip() == "child: 0 parent: True 1", result.stderr
