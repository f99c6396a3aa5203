"""What the DCP writer and reader share: the checkpoint directory they point at, and its backend."""

from __future__ import annotations

import os
from typing import Any

from flyte_checkpoint.distributed import _state_bridge
from flyte_checkpoint.errors import CheckpointError
from flyte_checkpoint.progress import ProgressCallback
from flyte_checkpoint.storage import Backend, StorageOptions
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.uris import check_supported


class CheckpointLocation:
    """A checkpoint directory (local path or storage URI) and the options to reach it."""

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        storage_options: StorageOptions | None,
        progress: ProgressCallback | None = None,
        transfer: TransferSettings | None = None,
    ) -> None:
        self.root = _state_bridge.root_of(checkpoint_dir)
        self.storage_options = dict(storage_options) if storage_options is not None else None
        self.transfer = transfer
        """This package's transfer settings (``None``: read from :attr:`storage_options`)."""
        self.progress = progress
        """``progress(bytes_done, total)`` of this rank's transfers (``total`` ``None`` on save)."""
        self._backend: Backend | None = None

    # The backend holds clients and event loops that do not pickle: a pickled writer (async_save
    # in process mode) builds its own on first use. A progress callback belongs to the process
    # that gave it (often a closure, which does not pickle either), so a copy in another
    # process reports nothing.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_backend"] = None
        state["progress"] = None
        return state

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = _state_bridge.backend_of(self.root, self.storage_options, self.transfer)
        return self._backend

    @property
    def checkpoint_id(self) -> str:
        return self.root

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            check_supported(os.fspath(checkpoint_id))
        except (CheckpointError, TypeError):
            return False
        return True

    def _retarget(self, checkpoint_id: str | os.PathLike[str] | None) -> bool:
        """Point at ``checkpoint_id`` when DCP gives one (``reset``); whether the root changed."""
        if not checkpoint_id:
            return False
        root = _state_bridge.root_of(checkpoint_id)
        if root == self.root:
            return False
        self.root = root
        self._backend = None
        return True
