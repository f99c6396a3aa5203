"""Checkpoint locations for remote runs, derived beneath the run's output path."""

from __future__ import annotations

import os
import uuid

from flyte_checkpoint.context import CheckpointPaths
from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.uris import clean_uri

RUN_BASE_DIR_ENV = "FLYTE_CHECKPOINT_RUN_BASE_DIR"


def checkpoint_paths_for_run(output_path: str, random_id: str | None = None) -> CheckpointPaths:
    """``{output_path}/rd/{random_id}/checkpoint`` and ``.../prev_checkpoint`` for one run.

    ``random_id`` defaults to a fresh random hex id, so separate runs never share checkpoints.
    """
    base = clean_uri(output_path)
    if base is None:
        raise ConfigurationError("output_path is empty; pass the run's output location")
    raw_data_path = f"{base.rstrip('/')}/rd/{random_id or uuid.uuid4().hex}"
    return CheckpointPaths(
        prev_checkpoint_path=f"{raw_data_path}/prev_checkpoint",
        checkpoint_path=f"{raw_data_path}/checkpoint",
    )


def run_output_path(run_name: str, *, run_base_dir: str | None = None) -> str:
    """The output path of run ``run_name``: ``{run_base_dir}/{run_name}``.

    ``run_base_dir`` defaults to the ``FLYTE_CHECKPOINT_RUN_BASE_DIR`` environment variable.
    """
    base = clean_uri(run_base_dir) or clean_uri(os.environ.get(RUN_BASE_DIR_ENV))
    if base is None:
        raise ConfigurationError(
            "no run_base_dir configured: remote runs derive their checkpoint paths from it; pass "
            f"run_base_dir='s3://bucket/runs' (or any storage URI) or set {RUN_BASE_DIR_ENV}"
        )
    if not run_name or "/" in run_name:
        raise ConfigurationError(f"run name {run_name!r} must be non-empty and contain no '/'")
    return f"{base.rstrip('/')}/{run_name}"
