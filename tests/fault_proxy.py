"""Only for ``tests/storage`` and ``tests/preemption``, whose files other changes own: the fault proxy
now lives in :mod:`tests.faults.proxy`. Delete this file once their imports name the new module."""

from tests.faults.proxy import (
    FaultProxy,
    RequestRecord,
    drop_before_response,
    drop_mid_request,
    drop_mid_response,
    stall,
    status,
)

__all__ = [
    "FaultProxy",
    "RequestRecord",
    "drop_before_response",
    "drop_mid_request",
    "drop_mid_response",
    "stall",
    "status",
]
