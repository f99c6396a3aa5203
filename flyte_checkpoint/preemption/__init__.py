"""Preemption: a notice that the machine is being taken away, and the time left to save.

See :mod:`.notice` (what is recorded, the grace period, the deadline) and :mod:`.handler` (the
signal handler, and how a task that does not handle the notice is ended once its saves are done).
"""

from __future__ import annotations

from flyte_checkpoint.preemption.handler import PreemptionHandler, install_preemption_handler
from flyte_checkpoint.preemption.notice import (
    DEFAULT_GRACE_SECONDS,
    GRACE_SECONDS_ENV,
    PreemptionNotice,
    current_notice,
    notify,
)

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "GRACE_SECONDS_ENV",
    "PreemptionHandler",
    "PreemptionNotice",
    "current_notice",
    "install_preemption_handler",
    "notify",
]
