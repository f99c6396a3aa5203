"""A task that never reads the notice is ended once its saves are done; when the ``Preempted``
raised into it is swallowed (C code that clears every pending exception does that: a SIGTERM
during ``import torch`` left the task running into the SIGKILL), it is told again in time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.faults.signals.processes import running


def test_a_task_that_swallowed_its_ending_is_ended_again_before_the_sigkill(tmp_path: Path) -> None:
    grace = 8.0
    argv = ["run", "--checkpoint-path", str(tmp_path / "cur"), "--grace-seconds", str(grace)]
    with running(
        [*argv, "tests.runner_programs:swallow_the_first_ending"], module="flyte_checkpoint"
    ) as program:
        program.wait_for_line("ready")
        program.send(signal.SIGTERM)
        status = program.finish_or_kill(time.monotonic() + grace)
    assert "swallowed" in program.output()
    assert status == 128 + signal.SIGTERM, program.output()  # used to run on into the SIGKILL
