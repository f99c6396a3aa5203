"""Atomic, verified ``torch.distributed.checkpoint`` (DCP) storage, on every backend we support.

::

    import torch.distributed.checkpoint as dcp
    from flyte_checkpoint.distributed import CheckpointReader, CheckpointWriter

    dcp.save(state_dict, storage_writer=CheckpointWriter("s3://bucket/run/ckpt"))   # every rank
    dcp.load(state_dict, storage_reader=CheckpointReader("s3://bucket/run/ckpt"))   # any world size

Each rank writes its shard straight to storage; the coordinator commits the save by one pointer
write after every rank has written, so a save is all-or-nothing across ranks, and a load verifies
every item it reads. :class:`DistributedCheckpointManager` adds numbered steps, retention and
fall-back; :func:`task_locations` gives the roots of a Flyte task attempt.
"""

from flyte_checkpoint.distributed.manager import DistributedCheckpointManager, checkpoint_failure
from flyte_checkpoint.distributed.reader import CheckpointReader, CommittedMetadata, read_committed_metadata
from flyte_checkpoint.distributed.task import DistributedLocations, task_locations
from flyte_checkpoint.distributed.writer import CheckpointWriter, Retention
from flyte_checkpoint.steps import RestoredStep

__all__ = [
    "CheckpointReader",
    "CheckpointWriter",
    "CommittedMetadata",
    "DistributedCheckpointManager",
    "DistributedLocations",
    "RestoredStep",
    "Retention",
    "checkpoint_failure",
    "read_committed_metadata",
    "task_locations",
]
