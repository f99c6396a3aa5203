"""Retry runners: the retry loop (:mod:`.retries`), remote path derivation (:mod:`.remote`) and
one attempt (:mod:`.attempt`)."""

from flyte_checkpoint.runners.attempt import load_and_run_task
from flyte_checkpoint.runners.remote import checkpoint_paths_for_run, run_output_path
from flyte_checkpoint.runners.retries import run_with_retries, run_with_retries_async

__all__ = [
    "checkpoint_paths_for_run",
    "load_and_run_task",
    "run_output_path",
    "run_with_retries",
    "run_with_retries_async",
]
