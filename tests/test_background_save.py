"""Only for ``tests/preemption``, whose files another change owns: the upload faults it imports from
here now live in :mod:`tests.saving.faults`. Delete this file once that import names the new module."""

from tests.saving.faults import failing_uploads, stall_uploads

__all__ = ["failing_uploads", "stall_uploads"]
