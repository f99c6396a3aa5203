"""Preemption: a notice that the machine is being taken away, and the time left to save.

See :mod:`.notice` (what is recorded, the grace period, the deadline) and :mod:`.handler` (the
signal handler, and how a task that does not handle the notice is ended once its saves are done);
:mod:`.cloud` turns a cloud's earlier warning (AWS Spot, GCE, Azure) into the same notice.
What the process knows about preemption is one object, :data:`.state.STATE`.
"""

from __future__ import annotations

from flyte_checkpoint.preemption.cloud import CLOUD_NOTICES_ENV, CloudNoticeWatcher, watch_cloud_notices
from flyte_checkpoint.preemption.handler import PreemptionHandler, install_preemption_handler, reclaim_signals
from flyte_checkpoint.preemption.notice import GRACE_SECONDS_ENV, current_notice, notify
from flyte_checkpoint.preemption.state import DEFAULT_GRACE_SECONDS, PreemptionNotice

__all__ = [
    "CLOUD_NOTICES_ENV",
    "DEFAULT_GRACE_SECONDS",
    "GRACE_SECONDS_ENV",
    "CloudNoticeWatcher",
    "PreemptionHandler",
    "PreemptionNotice",
    "current_notice",
    "install_preemption_handler",
    "notify",
    "reclaim_signals",
    "watch_cloud_notices",
]
