"""Where the ranks of a Flyte task attempt keep their distributed checkpoint, and resume from."""

from __future__ import annotations

from dataclasses import dataclass

from flyte_checkpoint.context import TaskContext, ctx
from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.uris import clean_uri, is_local, repair_prev_checkpoint_uri

DCP_SUFFIX = ".dcp"
"""A distributed checkpoint lives beside the attempt's single-object checkpoint, as a directory
``<checkpoint_path>.dcp``: inside it would clash with that object on local disk."""


@dataclass(frozen=True)
class DistributedLocations:
    """This attempt's DCP checkpoint root, and the previous attempt's (``None`` when there is none
    or it is the same place, as in Flyte's local mode where every attempt shares one location)."""

    save_root: str
    resume_root: str | None


def task_locations(context: TaskContext | None = None) -> DistributedLocations:
    """The DCP checkpoint roots of the running Flyte task attempt (``flyte_checkpoint.ctx()``).

    Derived from the task's checkpoint paths only, so every rank of the attempt computes the same
    ones without talking to the others. Give them to :class:`DistributedCheckpointManager` as
    ``root`` and ``resume_from``: a retried attempt then resumes from the last step the previous
    attempt committed.
    """
    context = context if context is not None else ctx()
    paths = context.checkpoint_paths if context is not None else None
    dest = clean_uri(paths.checkpoint_path) if paths is not None else None
    if dest is None:
        raise ConfigurationError(
            "no checkpoint path: call this inside a Flyte task attempt (flyte_checkpoint.ctx() has "
            "no checkpoint_paths), or give the manager a root yourself"
        )
    assert context is not None
    assert paths is not None
    save_root = dest.rstrip("/") + DCP_SUFFIX
    prev = clean_uri(paths.prev_checkpoint_path)
    resume_root = None
    if prev is not None:
        if not is_local(prev):
            prev = repair_prev_checkpoint_uri(
                prev, run_name=context.run_name, action_name=context.action_name
            )
        resume_root = prev.rstrip("/") + DCP_SUFFIX
    return DistributedLocations(save_root, resume_root if resume_root != save_root else None)
