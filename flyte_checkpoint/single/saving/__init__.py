"""The single-object save path of a checkpoint helper.

:class:`~.scheduler.SaveScheduler` owns a helper's saves: each is a frozen
:class:`~.job.SaveJob` (:mod:`.snapshot` isolates a background one from later writes), run now
or by the :class:`~.background.BackgroundSaver`, committed in call order
(:class:`~.order.CommitOrder`) and, after a preemption notice, only when it fits the time left
(:class:`~.budget.SaveDurations`). The bytes move through :func:`flyte_checkpoint.single.transfer.save`.
Nothing here imports the helper or the task context.
"""

from __future__ import annotations

from flyte_checkpoint.single.saving.job import SaveTimes
from flyte_checkpoint.single.saving.scheduler import Destination, SaveScheduler

__all__ = ["Destination", "SaveScheduler", "SaveTimes"]
