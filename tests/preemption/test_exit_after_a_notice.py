"""A preempted process exits without the interpreter's last walk over every live object: that
collection took seconds of the grace period with an object store's client loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import atexit, gc, sys
    # Registered before the package's own hook, so (newest first) it runs after it.
    atexit.register(lambda: print("frozen" if gc.get_freeze_count() else "not frozen", flush=True))
    from flyte_checkpoint.preemption import notice
    if sys.argv[1] == "notice":
        notice.notify("SIGTERM", 30.0)
    """
)


def exit_report(*args: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_process_that_received_a_notice_freezes_its_objects_out_of_the_exit_collection() -> None:
    assert exit_report("notice") == "frozen"


def test_a_process_without_a_notice_exits_with_the_usual_collection() -> None:
    assert exit_report("none") == "not frozen"
