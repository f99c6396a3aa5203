"""The crash tests' outcome summary, printed at the end (the S3 server is the session one).

Sizes: by default every data kind is a few tens of MiB so that the whole of ``tests/faults/crash`` stays
near a minute on two cores. ``FLYTE_CHECKPOINT_SLOW_TESTS=1`` switches to the sizes of the
reliability issue (a 256 MiB file and 256 MiB bytes, a 256 MiB directory; 64 MiB on S3, whose
emulator keeps every upload in memory).
"""

from __future__ import annotations

import pytest

from tests.faults.crash.harness import RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how every series of kills ended: trials, outcomes, and where the kills landed."""
    if not RESULTS:
        return
    terminalreporter.section("crash consistency: outcomes of killed saves and loads")
    for log in RESULTS:
        terminalreporter.write_line(log.line())
