"""A DCP ``StorageWriter`` whose saves are all-or-nothing across ranks, on every backend we support.

How a save is atomic: the coordinator picks a fresh version id in ``prepare_global_plan`` and DCP
scatters it to every rank in its plan. Each rank writes its items as ONE object,
``versions/<id>/shard-<rank>.distcp``, through our atomic object writer (temp file + rename on
disk, one completed upload on object stores) and returns each item's offset, length and digest.
DCP gathers those results to the coordinator only when every rank wrote successfully; its
``finish`` then stores DCP's metadata in the same version and commits by replacing the one
pointer object last (``flyte_checkpoint.state``'s commit). A rank or coordinator that dies
earlier leaves an invisible version that the next commit removes; readers keep seeing the
previous checkpoint, complete.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from flyte_checkpoint.distributed import _state_bridge
from flyte_checkpoint.distributed.location import CheckpointLocation
from flyte_checkpoint.distributed.records import ItemLocation, SaveTarget, shard_name
from flyte_checkpoint.errors import CheckpointError, InvalidCheckpointInputError, UnsupportedTypeError
from flyte_checkpoint.progress import ProgressCallback, log_transfer, reporter
from flyte_checkpoint.storage import COPY_CHUNK, DIGEST_KEY, Backend, StorageOptions
from flyte_checkpoint.storage.digests import digest_of
from flyte_checkpoint.storage.options import TransferSettings
from flyte_checkpoint.storage.retry import RetryPolicy

logger = logging.getLogger("flyte_checkpoint")

RETRY = RetryPolicy()
"""Transient storage failures are retried; a shard is rewritten from the state dict, so restartable."""


@dataclasses.dataclass(frozen=True)
class Retention:
    """What the coordinator deletes after a commit: steps beyond the newest ``keep_last`` under
    ``steps_root``, never ``protect``. Carried by the writer, so async and process saves apply it."""

    steps_root: str
    keep_last: int
    protect: frozenset[int]


def encoded_item(item: WriteItem, data: object) -> tuple[memoryview, str | None, tuple[int, ...] | None]:
    """The bytes stored for one item, with the tensor's dtype and shape (``None`` for a blob).

    Tensors are stored as their raw bytes in C order, not through ``torch.save``: nothing to
    parse on load, and the digest covers exactly what the tensor holds.
    """
    if item.type == WriteItemType.BYTE_IO:
        if not isinstance(data, io.BytesIO):
            raise UnsupportedTypeError(f"DCP gave a {type(data).__name__} for blob item {item.index.fqn}")
        return memoryview(data.getvalue()), None, None
    if not isinstance(data, torch.Tensor):
        raise UnsupportedTypeError(f"DCP gave a {type(data).__name__} for tensor item {item.index.fqn}")
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    return (
        memoryview(cast(bytes, raw)).cast("B"),
        str(tensor.dtype).removeprefix("torch."),
        tuple(tensor.shape),
    )


def write_shard(
    backend: Backend,
    uri: str,
    object_name: str,
    items: Iterable[WriteItem],
    resolve: Callable[[WriteItem], Any],
    progress: ProgressCallback | None = None,
) -> list[WriteResult]:
    """Write ``items`` into one object at ``uri`` atomically; the results locate and pin each item.

    ``progress(bytes_written, None)`` is told how far the object got (its size is known only
    once DCP has resolved every item).
    """
    placed: list[tuple[WriteItem, int, int, str, str | None, tuple[int, ...] | None]] = []
    writer = backend.open_write(uri, {}, progress=reporter(progress, None))
    try:
        for item in items:
            view, dtype, shape = encoded_item(item, resolve(item))
            offset = writer.tell()
            # In COPY_CHUNK slices: larger single writes can stall in the kernel (see COPY_CHUNK).
            for start in range(0, len(view), COPY_CHUNK):
                writer.write(view[start : start + COPY_CHUNK])
            placed.append((item, offset, len(view), digest_of(view), dtype, shape))
    except BaseException:
        writer.abort()
        raise
    info = writer.commit()
    object_digest = info.metadata[DIGEST_KEY]
    return [
        WriteResult(
            index=item.index,
            size_in_bytes=length,
            storage_data=ItemLocation(
                object_name=object_name,
                offset=offset,
                length=length,
                digest=digest,
                dtype=dtype,
                shape=shape,
                object_size=info.size,
                object_digest=object_digest,
            ),
        )
        for item, offset, length, digest, dtype, shape in placed
    ]


class CheckpointWriter(CheckpointLocation, StorageWriter):
    """Save a DCP checkpoint to ``checkpoint_dir`` (local path, ``s3://``, ``gs://``, ``abfs://``...).

    Use it with ``torch.distributed.checkpoint.save`` or ``async_save`` (thread or process mode;
    the writer is picklable)::

        dcp.save(state_dict, storage_writer=CheckpointWriter("s3://bucket/run/ckpt"))

    Every save replaces the checkpoint atomically across all ranks: a later load sees the
    previous save or this one, complete, never a mix, whatever process dies when. Load it with
    :class:`CheckpointReader`. ``metadata`` (a JSON dict) is recorded with the commit. One
    writer at a time per checkpoint directory.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        *,
        storage_options: StorageOptions | None = None,
        transfer: TransferSettings | None = None,
        metadata: dict[str, Any] | None = None,
        retention: Retention | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        StorageWriter.__init__(self)
        CheckpointLocation.__init__(self, checkpoint_dir, storage_options, progress, transfer)
        self._started = time.monotonic()
        self.metadata = _state_bridge.checked_metadata(metadata)
        self.retention = retention
        self.save_id = uuid.uuid4().hex
        self.rank = 0
        self.is_coordinator = False
        self.version_id: str | None = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return CheckpointLocation.validate_checkpoint_id(checkpoint_id)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._retarget(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self.version_id = None
        self._started = time.monotonic()  # DCP resets the writer as each save begins

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise InvalidCheckpointInputError(
                "CheckpointWriter needs use_collectives=True: an all-or-nothing save is committed by "
                "the coordinator once every rank has written, which DCP's collectives tell it"
            )
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank") or 0)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.root, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        self.version_id = _state_bridge.new_version_id()
        return [
            dataclasses.replace(plan, storage_data=SaveTarget(self.version_id, shard_name(rank)))
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        target = plan.storage_data
        if not isinstance(target, SaveTarget):
            raise InvalidCheckpointInputError(
                "the save plan carries no target version: CheckpointWriter.prepare_global_plan did "
                "not run (use torch.distributed.checkpoint.save or async_save)"
            )
        self.version_id = target.version_id
        bytes_first = sorted(plan.items, key=lambda item: item.type != WriteItemType.BYTE_IO)
        uri = _state_bridge.object_uri(self.root, target.version_id, target.object_name)
        results: list[WriteResult] = []
        if bytes_first:
            results = RETRY.call(
                lambda: write_shard(
                    self.backend, uri, target.object_name, bytes_first, planner.resolve_data, self.progress
                ),
                describe=f"saving {uri}",
            )
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Store DCP's metadata in the version every rank wrote, then commit it (pointer last)."""
        version = self.version_id
        if version is None:
            raise InvalidCheckpointInputError("finish() ran before prepare_global_plan(); nothing to commit")
        locations: dict[Any, ItemLocation] = {}
        shards: dict[str, _state_bridge.StoredObject] = {}
        for rank_results in results:
            for result in rank_results:
                location = result.storage_data
                assert isinstance(location, ItemLocation)
                locations[result.index] = location
                shards[location.object_name] = _state_bridge.StoredObject(
                    location.object_name, location.object_size, location.object_digest
                )
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = locations
        metadata.storage_meta = self.storage_meta()
        _state_bridge.commit_version(
            self.root,
            self.storage_options,
            version,
            [shards[name] for name in sorted(shards)],
            pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL),
            self.metadata,
            self.transfer,
        )
        stored = [shards[name] for name in sorted(shards)]
        what = f"DCP version {version} ({len(stored)} shards, {len(results)} ranks)"
        log_transfer("saved", self.root, what, sum(shard.size for shard in stored), self._started)
        self._apply_retention()

    def _apply_retention(self) -> None:
        retention = self.retention
        if retention is None:
            return
        try:
            deleted = _state_bridge.apply_retention(
                retention.steps_root,
                self.storage_options,
                retention.keep_last,
                set(retention.protect),
                self.transfer,
            )
        except CheckpointError as exc:
            # The save is committed; retention is housekeeping that the next save retries.
            logger.warning("retention under %s failed (the next save retries): %s", retention.steps_root, exc)
            return
        if deleted:
            logger.info("retention deleted steps %s under %s", deleted, retention.steps_root)
