"""Checkpoints that long-running, retried tasks can trust.

Inside a task, ``ctx().checkpoint`` is this attempt's :class:`Checkpoint`: ``load()``/``save()``
in ``async def`` tasks, ``load_sync()``/``save_sync()`` in ``def`` tasks.
"""

from flyte_checkpoint.archive import ExtractionLimits
from flyte_checkpoint.context import CheckpointPaths, TaskContext, ctx, current_checkpoint, task_context
from flyte_checkpoint.errors import (
    ArchiveIndexError,
    ArchiveLimitError,
    BackendNotInstalledError,
    CheckpointChunkError,
    CheckpointClosedError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPartError,
    CheckpointPermissionError,
    CheckpointStorageError,
    CheckpointTimeoutError,
    CheckpointUnavailableError,
    ConfigurationError,
    InputChangedError,
    InvalidCheckpointInputError,
    NoTaskCheckpointError,
    Preempted,
    PreemptionDeadlineError,
    UnsafeArchiveError,
    UnsupportedTypeError,
    UnsupportedURIError,
    UntrustedContentError,
)
from flyte_checkpoint.newest_file import latest_checkpoint
from flyte_checkpoint.preemption import PreemptionNotice, install_preemption_handler
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.runners import (
    checkpoint_paths_for_run,
    load_and_run_task,
    run_output_path,
    run_with_retries,
    run_with_retries_async,
)
from flyte_checkpoint.single.checkpoint import (
    CHECKPOINT_CACHE_KEY,
    BaseCheckpoint,
    Checkpoint,
    SaveData,
)
from flyte_checkpoint.single.earlier_attempts import RestoredFrom
from flyte_checkpoint.single.saving import SaveTimes
from flyte_checkpoint.single.transfer import PAYLOAD_BASENAME
from flyte_checkpoint.storage import StorageOptions
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.retry import RetryPolicy
from flyte_checkpoint.uris import repair_prev_checkpoint_uri

__version__ = "0.1.0"
"""The version of this package."""

__all__ = [
    "CHECKPOINT_CACHE_KEY",
    "PAYLOAD_BASENAME",
    "ArchiveIndexError",
    "ArchiveLimitError",
    "BackendNotInstalledError",
    "BaseCheckpoint",
    "Checkpoint",
    "CheckpointChunkError",
    "CheckpointClosedError",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointPartError",
    "CheckpointPaths",
    "CheckpointPermissionError",
    "CheckpointStorageError",
    "CheckpointTimeoutError",
    "CheckpointUnavailableError",
    "ConfigurationError",
    "ExtractionLimits",
    "InputChangedError",
    "InvalidCheckpointInputError",
    "NoTaskCheckpointError",
    "Preempted",
    "PreemptionDeadlineError",
    "PreemptionNotice",
    "ProgressCallback",
    "RestoredFrom",
    "RetryPolicy",
    "SaveData",
    "SaveTimes",
    "StorageOptions",
    "TaskContext",
    "TransferSettings",
    "UnsafeArchiveError",
    "UnsupportedTypeError",
    "UnsupportedURIError",
    "UntrustedContentError",
    "__version__",
    "checkpoint_paths_for_run",
    "ctx",
    "current_checkpoint",
    "install_preemption_handler",
    "latest_checkpoint",
    "load_and_run_task",
    "repair_prev_checkpoint_uri",
    "run_output_path",
    "run_with_retries",
    "run_with_retries_async",
    "task_context",
]
