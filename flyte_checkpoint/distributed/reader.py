"""A DCP ``StorageReader`` that loads only the committed version and verifies every item it reads.

Each rank reads the objects its load plan needs, front to back in one stream per object, and
checks every item's bytes against the digest recorded at save time before DCP copies them into
the state dict; a damaged or missing shard raises :class:`CheckpointCorruptError` naming it.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from collections import defaultdict
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from flyte_checkpoint.distributed import _state_bridge
from flyte_checkpoint.distributed.location import CheckpointLocation
from flyte_checkpoint.distributed.records import ItemLocation, LoadSource
from flyte_checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointUnavailableError,
)
from flyte_checkpoint.progress import ProgressCallback, combined
from flyte_checkpoint.storage import StorageOptions, VerifyingReader
from flyte_checkpoint.storage.digests import ContentDigest
from flyte_checkpoint.storage.options import TransferSettings

_SKIP_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class CommittedMetadata:
    """DCP's metadata of the committed version of a checkpoint directory, verified."""

    version_id: str
    metadata: Metadata
    user_metadata: dict[str, Any]
    shards: dict[str, _state_bridge.StoredObject]


def read_committed_metadata(
    root: str, storage_options: StorageOptions | None, transfer: TransferSettings | None = None
) -> CommittedMetadata:
    """Follow the pointer of ``root`` and load DCP's metadata of that version, checked by digest.

    Raises :class:`CheckpointNotFoundError` when nothing is committed and
    :class:`CheckpointCorruptError` when the pointer, manifest or metadata is damaged.
    """
    committed = _state_bridge.read_committed_version(root, storage_options, transfer)
    label = f"the DCP metadata of checkpoint {root}"
    data = _state_bridge.fetch_verified(
        root, storage_options, committed.version_id, committed.metadata_object, label, transfer
    )
    try:
        metadata = pickle.loads(data)
    except Exception as exc:
        raise CheckpointCorruptError(
            f"{label} cannot be decoded ({exc!r}); it matches its digest, so "
            "it was written by an incompatible torch or flyte-checkpoint"
        ) from exc
    if not isinstance(metadata, Metadata):
        raise CheckpointCorruptError(f"{label} holds a {type(metadata).__name__}, not DCP Metadata")
    return CommittedMetadata(committed.version_id, metadata, committed.user_metadata, dict(committed.shards))


class CheckpointReader(CheckpointLocation, StorageReader):
    """Load the committed DCP checkpoint of ``checkpoint_dir`` (written by :class:`CheckpointWriter`).

    Use it with ``torch.distributed.checkpoint.load``, with any world size (DCP reshards)::

        dcp.load(state_dict, storage_reader=CheckpointReader("s3://bucket/run/ckpt"))

    ``committed`` pins a version already read with :func:`read_committed_metadata` (the manager
    does, to decide on every rank alike whether a step is usable).
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        *,
        storage_options: StorageOptions | None = None,
        transfer: TransferSettings | None = None,
        committed: CommittedMetadata | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        StorageReader.__init__(self)
        CheckpointLocation.__init__(self, checkpoint_dir, storage_options, progress, transfer)
        self.load_id = uuid.uuid4().hex
        self.committed = committed

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return CheckpointLocation.validate_checkpoint_id(checkpoint_id)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if self._retarget(checkpoint_id):
            self.committed = None
        self.load_id = uuid.uuid4().hex

    def read_metadata(self) -> Metadata:
        if self.committed is None:
            self.committed = read_committed_metadata(self.root, self.storage_options, self.transfer)
        metadata = self.committed.metadata
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if self.committed is None or self.committed.metadata is not metadata:
            raise CheckpointError("set_up_storage_reader() got metadata this reader did not read")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        assert self.committed is not None
        return dataclasses.replace(plan, storage_data=LoadSource(self.committed.version_id))

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        versions = {
            plan.storage_data.version_id for plan in plans if isinstance(plan.storage_data, LoadSource)
        }
        if len(versions) > 1:
            raise CheckpointUnavailableError(
                f"the ranks read different committed versions of {self.root} ({sorted(versions)}): a "
                "save committed while this load started; nothing was loaded, load again"
            )
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.committed is not None
        locations = cast(dict[MetadataIndex, ItemLocation], self.committed.metadata.storage_data)
        by_object: dict[str, list[ReadItem]] = defaultdict(list)
        for request in plan.items:
            by_object[locations[request.storage_index].object_name].append(request)
        shards = self.committed.shards
        # What this rank reads: the whole of each shard holding an item it needs, front to back.
        told = combined(self.progress, sum(shards[name].size for name in by_object if name in shards))
        for name, requests in sorted(by_object.items()):
            self._read_object(
                name, requests, locations, planner, None if told is None else told.reader_part()
            )
        if told is not None:
            told.finish()
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_object(
        self,
        name: str,
        requests: list[ReadItem],
        locations: dict[MetadataIndex, ItemLocation],
        planner: LoadPlanner,
        progress: ProgressCallback | None,
    ) -> None:
        assert self.committed is not None
        version = self.committed.version_id
        uri = _state_bridge.object_uri(self.root, version, name)
        recorded = self.committed.shards.get(name)
        if recorded is None:
            raise CheckpointCorruptError(
                f"checkpoint {self.root} is damaged: DCP's metadata places items in shard {uri}, "
                "which the commit's manifest does not record"
            )
        reader = self.backend.open_read(uri, progress=progress)
        if reader is None:
            self._raise_missing(uri)
        assert reader is not None
        with reader:
            if reader.info.size != recorded.size:
                raise CheckpointCorruptError(
                    f"checkpoint {self.root} is damaged: shard {uri} holds {reader.info.size} bytes, but "
                    f"{recorded.size} were written"
                )
            _deliver_items(reader, uri, requests, locations, planner)
            if progress is not None:  # done with it: bytes after the last item needed are not read
                progress(reader.info.size, reader.info.size)

    def _raise_missing(self, uri: str) -> None:
        assert self.committed is not None
        if _state_bridge.version_replaced(
            self.root, self.storage_options, self.committed.version_id, self.transfer
        ):
            raise CheckpointUnavailableError(
                f"checkpoint {self.root} was replaced by a newer save while it was being loaded "
                f"({uri} is gone); load again"
            )
        raise CheckpointCorruptError(f"checkpoint {self.root} is damaged: its shard {uri} is missing")


def _deliver_items(
    reader: VerifyingReader,
    uri: str,
    requests: list[ReadItem],
    locations: dict[MetadataIndex, ItemLocation],
    planner: LoadPlanner,
) -> None:
    """Stream one object front to back, checking each needed item before DCP applies it."""
    wanted: dict[int, list[ReadItem]] = defaultdict(list)
    by_offset: dict[int, ItemLocation] = {}
    for request in requests:
        location = locations[request.storage_index]
        wanted[location.offset].append(request)
        by_offset[location.offset] = location
    position = 0
    for offset in sorted(wanted):
        location = by_offset[offset]
        position += _skip(reader, offset - position)
        data = _read_exactly(reader, location.length)
        position += data.numel()
        if data.numel() != location.length:
            raise CheckpointCorruptError(
                f"shard {uri} is damaged: it ends at byte {position}, inside item "
                f"{wanted[offset][0].storage_index.fqn} (bytes {offset}..{offset + location.length})"
            )
        digest = ContentDigest.like(location.digest, where=f"shard {uri}")
        digest.update(memoryview(cast(bytes, data.numpy())))
        if digest.value != location.digest:
            raise CheckpointCorruptError(
                f"shard {uri} is damaged: item {wanted[offset][0].storage_index.fqn} (bytes {offset}.."
                f"{offset + location.length}) does not match the digest recorded when it was saved"
            )
        for request in wanted[offset]:
            _apply(request, data, location, planner)


def _apply(request: ReadItem, data: torch.Tensor, location: ItemLocation, planner: LoadPlanner) -> None:
    if request.type == LoadItemType.BYTE_IO:
        planner.load_bytes(request, io.BytesIO(data.numpy().tobytes()))
        return
    assert location.dtype is not None
    assert location.shape is not None
    dtype = getattr(torch, location.dtype)
    stored = data.view(dtype)
    tensor = narrow_tensor_by_index(stored.reshape(location.shape), request.storage_offsets, request.lengths)
    target = planner.resolve_tensor(request).detach()
    if target.size() != tensor.size():
        raise CheckpointCorruptError(
            f"item {request.storage_index.fqn} has shape {tuple(tensor.size())} in the checkpoint, but "
            f"the load asks for {tuple(target.size())}"
        )
    target.copy_(tensor)
    planner.commit_tensor(request, target)


def _skip(reader: VerifyingReader, count: int) -> int:
    scratch = bytearray(min(count, _SKIP_CHUNK))
    skipped = 0
    while skipped < count:
        view = memoryview(scratch)[: min(len(scratch), count - skipped)]
        got = reader.readinto(view)
        if not got:
            break
        skipped += got
    return skipped


def _read_exactly(reader: VerifyingReader, length: int) -> torch.Tensor:
    """The next ``length`` bytes (fewer at the end of the object), in an uninitialised uint8 tensor:
    no zero-filling of a buffer that is about to be overwritten, and DCP gets a tensor view of it."""
    buffer = torch.empty(length, dtype=torch.uint8)
    view = memoryview(cast(bytes, buffer.numpy()))
    filled = 0
    while filled < length:
        got = reader.readinto(view[filled:])
        if not got:
            return buffer[:filled]
        filled += got
    return buffer
