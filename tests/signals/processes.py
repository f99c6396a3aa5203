"""Re-export of :mod:`tests.faults.signals.processes` for ``tests/preemption`` (see the package)."""

from tests.faults.signals.processes import Program, running

__all__ = ["Program", "running"]
