"""The task module a Flyte task's container imports in the container-entry tests.

``python -m flyte._bin.runtime a0 ... --resolver flyte._internal.resolvers.default.DefaultTaskResolver
mod tests.integrations.flyte_container instance NAME`` loads task NAME from here. Importing it
installs the plugin, as a user's task module does; the test process itself never imports it.
"""

from __future__ import annotations

import flyte_checkpoint.integrations.flyte as flyte_plugin
from tests.integrations.flyte_tasks import count_until_preempted, count_until_preempted_async

flyte_plugin.install()

__all__ = ["count_until_preempted", "count_until_preempted_async"]
