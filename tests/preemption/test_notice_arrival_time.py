"""The grace clock starts when the signal arrives, not when Python gets round to its handler
(after a long C call holding the main thread)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux",
    reason="SO_TIMESTAMPNS is Linux's: elsewhere a notice is dated when Python runs the handler, as before",
)

BUSY_IN_C = textwrap.dedent(
    """
    import time
    from flyte_checkpoint.preemption import current_notice, install_preemption_handler

    with install_preemption_handler(grace_seconds=30, end_main_thread=False):
        print("ready", flush=True)
        sum(range(400_000_000))  # one C call: no bytecode runs, so no Python signal handler
        ended = time.monotonic()
        time.sleep(0.1)  # the watcher thread dates the notice as soon as it next runs
        notice = current_notice()
        assert notice is not None
        print(notice.received_at, ended, notice.time_left(), flush=True)
    """
)


def test_a_notice_during_a_long_c_call_is_dated_when_the_signal_arrived() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", BUSY_IN_C], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        sent = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        os.kill(process.pid, signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    received_at, ended, left = (float(field) for field in out.split())
    late = ended - sent  # when the handler ran: where the old clock started
    assert late > 1.0, f"the C call ended {late:.2f} s after the signal: too short to tell"
    # Within half a second of the kill even on a loaded machine, and well before the handler ran.
    assert -0.05 < received_at - sent < min(0.5, late / 2), err
    assert left < 30 - late + 0.5
