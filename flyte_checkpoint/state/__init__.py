"""Multi-part checkpoints: one consistent, atomically committed state of several components or ranks.

In one process::

    from flyte_checkpoint.state import save_checkpoint, load_checkpoint

    save_checkpoint("s3://bucket/run/ckpt", controller=ctl, parts=[unit0, unit1], metadata={"step": 7},
                    lock=state_lock)
    metadata = load_checkpoint("s3://bucket/run/ckpt", controller=ctl, parts=[unit0, unit1])

Across processes, each rank stores its own part and only an acknowledgement reaches the
coordinator::

    version = begin(ckpt)                                 # coordinator
    write_part(ckpt, None, model, version_id=version)     # each rank (position = its RANK)
    commit(ckpt, version, world_size=4, controller=ctl, workers=processes, timeout=300)

Components follow :class:`Stateful` (``state_dict``/``load_state_dict``) or :class:`FileComponent`
(``save_to_path``/``load_from_path``). :class:`CheckpointManager` keeps numbered steps with
retention and falls back to an older step when the newest fails verification.
"""

from flyte_checkpoint.state.api import load_checkpoint, save_checkpoint, verify_checkpoint
from flyte_checkpoint.state.commit import Worker, begin, commit
from flyte_checkpoint.state.components import (
    PICKLE,
    Component,
    FileComponent,
    PickleSerializer,
    Serializer,
    Stateful,
)
from flyte_checkpoint.state.manager import CheckpointManager, RestoredStep, StepSummary
from flyte_checkpoint.state.manifest import CommitPointer, Manifest, PartAck, PartRecord
from flyte_checkpoint.state.parts import PartData, load_controller, load_part, read_part, write_part
from flyte_checkpoint.state.runtime import DEFAULT_TIMEOUT, LockLike

__all__ = [
    "DEFAULT_TIMEOUT",
    "PICKLE",
    "CheckpointManager",
    "CommitPointer",
    "Component",
    "FileComponent",
    "LockLike",
    "Manifest",
    "PartAck",
    "PartData",
    "PartRecord",
    "PickleSerializer",
    "RestoredStep",
    "Serializer",
    "Stateful",
    "StepSummary",
    "Worker",
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
