"""Multi-part checkpoints: one consistent, atomically committed state of several components or ranks.

In one process::

    from flyte_checkpoint.state import StateCheckpoint

    checkpoint = StateCheckpoint("s3://bucket/run/ckpt", timeout=300)
    checkpoint.save(controller=ctl, parts=[unit0, unit1], metadata={"step": 7}, lock=state_lock)
    manifest = checkpoint.load(controller=ctl, parts=[unit0, unit1])   # manifest.metadata

(``save_checkpoint``/``load_checkpoint`` do the same in one call.) Across processes, each rank
stores its own part and only an acknowledgement reaches the committer::

    version = checkpoint.begin()                                  # coordinator
    ack = checkpoint.write_part(None, model, version_id=version)  # each rank (position = its RANK)
    checkpoint.commit_version(version, gathered_acks, controller=ctl)

or, when the ranks have no channel to the coordinator, through storage:
``write_part(..., record_ack=True)`` in each rank and ``commit(version, world_size=4,
workers=processes)`` in the coordinator.

Components follow :class:`Stateful` (``state_dict``/``load_state_dict``) or :class:`FileComponent`
(``save_to_path``/``load_from_path``). :class:`CheckpointManager` keeps numbered steps with
retention and falls back to an older step when the newest fails verification.
"""

from flyte_checkpoint.state.api import (
    begin,
    commit,
    load_checkpoint,
    load_controller,
    load_part,
    read_part,
    save_checkpoint,
    verify_checkpoint,
    write_part,
)
from flyte_checkpoint.state.checkpoint import StateCheckpoint
from flyte_checkpoint.state.components import Component, FileComponent, PickleSerializer, Serializer, Stateful
from flyte_checkpoint.state.manager import CheckpointManager, StepSummary
from flyte_checkpoint.state.manifest import Manifest, PartAck
from flyte_checkpoint.steps import RestoredStep

__all__ = [
    "CheckpointManager",
    "Component",
    "FileComponent",
    "Manifest",
    "PartAck",
    "PickleSerializer",
    "RestoredStep",
    "Serializer",
    "StateCheckpoint",
    "Stateful",
    "StepSummary",
    "begin",
    "commit",
    "load_checkpoint",
    "load_controller",
    "load_part",
    "read_part",
    "save_checkpoint",
    "verify_checkpoint",
    "write_part",
]
