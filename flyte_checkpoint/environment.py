"""Process settings read from the environment: the attempt number and the launcher's ranks.

A leaf module (it imports only the errors), so that modules below the checkpoint helper, such as
:mod:`flyte_checkpoint.uris`, can read the attempt number without importing the task context.
"""

from __future__ import annotations

import os

from flyte_checkpoint.errors import ConfigurationError

# What a platform's container sets for each attempt (0-based); Flyte's executor does.
ATTEMPT_NUMBER_ENV = "FLYTE_ATTEMPT_NUMBER"

# The variables torchrun (and torch.distributed.launch, Lightning, Accelerate) set for each process.
RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
MASTER_ADDR_ENV = "MASTER_ADDR"
MASTER_PORT_ENV = "MASTER_PORT"


_LAUNCHER_HINT = "the launcher (e.g. torchrun) sets it, so check how this process was started, or unset it"


def _int_from_env(name: str, default: int, minimum: int, meaning: str, hint: str = _LAUNCHER_HINT) -> int:
    """``int(os.environ[name])`` (``default`` when unset or blank); a clear error when malformed."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value: int | None = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigurationError(f"{name}={raw!r} is not {meaning}; {hint}")
    return value


def attempt_number_from_env() -> int:
    """The 0-based attempt number in ``FLYTE_ATTEMPT_NUMBER`` (0 when unset); a clear error when malformed."""
    return _int_from_env(
        ATTEMPT_NUMBER_ENV,
        0,
        0,
        "an integer >= 0",
        "set it to the 0-based attempt number or unset it",
    )
