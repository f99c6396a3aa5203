"""Object stores through fsspec (s3fs, gcsfs, adlfs): saves and loads in parallel parts.

What all three stores share lives here: :class:`StoreProfile` (what differs between them, as data),
the option merging, the transfer settings
(:class:`~flyte_checkpoint.storage.options.TransferSettings`, given as ``transfer=`` or read from
``storage_options`` for every store before the client is built, so the client never sees them), the
overall time bound of every operation (:mod:`~flyte_checkpoint.storage.deadline`) and
:class:`FsspecBackend`. A save is a
:class:`~flyte_checkpoint.storage.parallel.writer.ParallelWriter`, a load a
:class:`~flyte_checkpoint.storage.parallel.reader.ParallelReader`, over the store's adapter
(:meth:`FsspecBackend.parallel_object`); each store's own module (:mod:`.s3`, :mod:`.gcs`,
:mod:`.azure`) holds its profile, names its adapter and does what else it does differently, the way
fsspec keeps one module per implementation.

Atomicity: an object store publishes an object only when the request that completes an upload
succeeds (S3's CompleteMultipartUpload, GCS's last compose, Azure's Put Block List, or the one PUT
of an object smaller than a part), which happens in :meth:`ObjectWriter.commit`; a failure
aborts the upload instead, and the previous object stays intact.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, ClassVar, Protocol, cast

from fsspec.asyn import sync

from flyte_checkpoint.errors import BackendNotInstalledError
from flyte_checkpoint.progress import ProgressCallback, ProgressReporter
from flyte_checkpoint.storage.base import (
    CONTENT_SIZE_KEY,
    DIGEST_KEY,
    FORMAT_KEY,
    FSYNC_OPTION,
    SIZE_KEY,
    Backend,
    ObjectInfo,
    ObjectWriter,
    VerifyingReader,
    WriteGate,
    modified_time,
)
from flyte_checkpoint.storage.deadline import TransferBound
from flyte_checkpoint.storage.errors import confirm_absent, constructor_error, translated_backend_errors
from flyte_checkpoint.storage.options import (
    TransferSettings,
    accepted_anywhere,
    accepted_by,
    check_names,
    split_transfer,
)
from flyte_checkpoint.storage.parallel.contract import RangeSource, UploadTarget
from flyte_checkpoint.storage.parallel.reader import ParallelReader
from flyte_checkpoint.storage.parallel.writer import ParallelWriter
from flyte_checkpoint.uris import scheme_of

logger = logging.getLogger("flyte_checkpoint")

_OUR_KEYS = (FORMAT_KEY, DIGEST_KEY, SIZE_KEY, CONTENT_SIZE_KEY)


@dataclass(frozen=True)
class StoreProfile:
    """What differs between the three object stores, learnt against their real servers."""

    implementation: str
    """The fsspec class, ``"module:Class"``. Named, not looked up in fsspec's registry: other
    libraries (the Flyte SDK's flyte.init() registers obstore) replace the registry's s3/gs/abfs
    entries process-wide."""
    extra: str
    """The ``flyte-checkpoint[...]`` extra that installs the implementation."""
    metadata_at_commit: bool
    """Whether metadata can still be set when the upload completes (Azure's block list can)."""
    server_side_copy: bool
    """Whether ``fs.copy`` finishes the copy before returning (Azure's may still be pending)."""
    defaults: Mapping[str, Any]
    """Storage options applied unless the caller gives their own: time bounds on every call."""
    own_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Options this package consumes itself (not passed to fsspec), with their defaults."""


def backend_requirement(profile: StoreProfile) -> str:
    """What ``pip install`` needs for ``profile``'s store: the requirement its extra lists in this
    package's metadata (``s3fs>=2024.2.0``), else the implementation's module, which is its
    distribution's name too. Not ``flyte-checkpoint[s3]``: the package is installed from a
    checkout or a wheel, and no registry has it, so that command fails."""
    try:
        required = importlib.metadata.requires("flyte-checkpoint") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        required = []
    marker = f'extra == "{profile.extra}"'
    for requirement in required:
        spec, _, condition = requirement.partition(";")
        if condition.strip() == marker:
            return spec.strip()
    return profile.implementation.partition(":")[0].partition(".")[0]


def _copied(value: Any) -> Any:
    """``value`` with its nested dicts copied; other objects (credentials, sessions) are shared."""
    return {key: _copied(item) for key, item in value.items()} if isinstance(value, dict) else value


def merged_options(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    # Deep copies: botocore's Config rewrites the ``retries`` dict it is given in place, which
    # changed these defaults after the first client, so fsspec's instance cache (keyed on the
    # options) missed and every later backend built a second client with its own parsed S3
    # service model, about 15 MiB that the cache then kept for the life of the process.
    options: dict[str, Any] = {key: _copied(value) for key, value in defaults.items()}
    for key, value in (given or {}).items():
        if isinstance(value, Mapping) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **_copied(dict(value))}
        else:
            options[key] = _copied(value)
    # Listings cached by fsspec never see objects other processes write: always ask the store.
    options.setdefault("use_listings_cache", False)
    return options


def our_metadata(raw: Mapping[str, Any]) -> dict[str, str]:
    """This package's metadata keys from what a store reports (which may hyphenate them)."""
    normalised = {key.lower().replace("-", "_"): str(value) for key, value in raw.items()}
    return {key: value for key, value in normalised.items() if key in _OUR_KEYS}


class StoreObject(UploadTarget, RangeSource, Protocol):
    """One object of a store, as both a parallel upload target and a ranged source."""


class FsspecBackend(Backend):
    """An object store reached through its fsspec implementation, with explicit options.

    Subclasses (one per store) set :attr:`profile`, name their adapter
    (:meth:`parallel_object`) and override what their store does differently
    (:meth:`_configure`, :meth:`info`, listings).
    """

    protocol: ClassVar[str]
    profile: ClassVar[StoreProfile]

    def __init__(
        self, storage_options: Mapping[str, Any] | None = None, transfer: TransferSettings | None = None
    ) -> None:
        self.records_digest_only_when_declared = not self.profile.metadata_at_commit
        where = f"{self.protocol}:// storage"
        check_names(storage_options or {}, accepted_by(self.protocol) or accepted_anywhere(), where)
        # Ours, read before the client is built: its constructor never sees them.
        self.transfer, given = split_transfer(storage_options, transfer, where)
        self._check_options(given)
        options = merged_options(self._defaults(self.transfer), given)
        options.pop(FSYNC_OPTION, None)  # a local-disk option; uploads are durable once complete
        own = {key: options.pop(key, default) for key, default in self.profile.own_options.items()}
        if own != dict(self.profile.own_options):
            # fsspec shares one instance per set of options, and these are set on the instance.
            options["skip_instance_cache"] = True
        try:
            module_name, _, class_name = self.profile.implementation.partition(":")
            self.fs = getattr(importlib.import_module(module_name), class_name)(**options)
        except ImportError as exc:
            raise BackendNotInstalledError(
                f"{self.protocol}:// storage needs an fsspec backend that is not installed ({exc}); "
                f"install it with: pip install '{backend_requirement(self.profile)}' (what the "
                f"package's [{self.profile.extra}] extra installs: from a checkout of it, "
                f"pip install '.[{self.profile.extra}]')"
            ) from exc
        except ValueError as exc:  # adlfs checks its credentials in the constructor
            raise constructor_error(exc, self.protocol) from exc
        self._configure(options, own)

    def _check_options(self, options: Mapping[str, Any]) -> None:
        """Refuse option values the store's client would accept and fail on later (none by default)."""

    def _defaults(self, transfer: TransferSettings) -> Mapping[str, Any]:
        """The client options applied unless the caller gives their own."""
        return self.profile.defaults

    def _configure(self, options: Mapping[str, Any], own: Mapping[str, Any]) -> None:
        """Apply :attr:`StoreProfile.own_options` to the new filesystem (nothing by default)."""

    def _errors(self, uri: str, action: str) -> contextlib.AbstractContextManager[None]:
        return translated_backend_errors(uri, action, scheme_of(uri))

    def deadline(self, uri: str, action: str, size: int | None = None) -> TransferBound:
        """The overall time bound of one operation on ``uri`` moving ``size`` bytes (see :mod:`.deadline`)."""
        return self.transfer.deadline(uri, action, getattr(self.fs, "loop", None), size)

    @contextlib.contextmanager
    def _bounded(self, uri: str, action: str, deadline: TransferBound | None = None) -> Iterator[None]:
        """Typed errors, and the operation's time bound (a new one unless ``deadline`` is given)."""
        bound = deadline or self.deadline(uri, action)
        try:
            with self._errors(uri, action), bound.scope():
                yield
        finally:
            if deadline is None:
                bound.finish()

    @abc.abstractmethod
    def parallel_object(self, uri: str) -> StoreObject:
        """The store's adapter for the object at ``uri``."""

    def open_write(
        self,
        uri: str,
        metadata: Mapping[str, str],
        *,
        declared_digest: str | None = None,
        declared_size: int | None = None,
        progress: ProgressReporter | None = None,
        gate: WriteGate | None = None,
    ) -> ObjectWriter:
        # Atomic: nothing is visible until the store completes the upload in commit() (see the
        # module docstring); a failure aborts it.
        return ParallelWriter.opened(
            self.parallel_object(uri),
            metadata,
            self.transfer,
            metadata_at_start=not self.profile.metadata_at_commit,
            declared_digest=declared_digest,
            declared_size=declared_size,
            progress=progress,
            gate=gate,
            deadline=self.deadline(uri, "saving", declared_size),
        )

    def open_read(self, uri: str, *, progress: ProgressCallback | None = None) -> VerifyingReader | None:
        deadline = self.deadline(uri, "loading")
        opened = self._open_stream(uri, deadline)
        if opened is None:
            deadline.finish()
            with self._bounded(uri, "loading"):
                confirm_absent(self.fs, uri, "loading", scheme_of(uri))  # a missing bucket is not "no object"
            return None
        stream, info = opened
        deadline.allow_for(info.size)
        return VerifyingReader(
            stream,
            info,
            changed_since=self._change_detector(uri, info),
            translate_errors=lambda: self._bounded(uri, "loading", deadline),
            progress=progress,
        )

    def _open_stream(self, uri: str, deadline: TransferBound) -> tuple[IO[bytes], ObjectInfo] | None:
        """The object's bytes (ordered parallel ranged reads) and description, or ``None``."""
        with self._errors(uri, "loading"):
            try:
                reader = ParallelReader.open(self.parallel_object(uri), self.transfer, deadline=deadline)
            except FileNotFoundError:
                return None
        if reader is None:
            return None
        return cast(IO[bytes], reader), reader.info

    def _change_detector(self, uri: str, opened: ObjectInfo) -> Callable[[], bool]:
        def changed() -> bool:
            try:
                now = self.info(uri)
            except Exception as exc:
                # Only asked to word a digest mismatch; unknown means "report the mismatch".
                logger.debug("could not re-read %s to see whether it was replaced: %r", uri, exc)
                return False
            return now is None or now.version != opened.version

        return changed

    def info(self, uri: str) -> ObjectInfo | None:
        with self._bounded(uri, "inspecting"):
            try:
                details = self.fs.info(uri)
            except FileNotFoundError:
                return None
        if details.get("type") == "directory":
            return None
        version = details.get("ETag") or details.get("generation") or details.get("etag")
        modified = details.get("LastModified") or details.get("updated") or details.get("last_modified")
        return ObjectInfo(
            uri=uri,
            size=int(details.get("size") or 0),
            metadata=our_metadata(details.get("metadata") or {}),
            version=str(version) if version is not None else None,
            modified=modified_time(modified),
        )

    def copy(self, src: str, dst: str) -> None:
        if not self.profile.server_side_copy:
            super().copy(src, dst)
            return
        with self._bounded(dst, "copying"):
            self.fs.copy(src, dst)  # CopyObject / rewrite: atomic at dst, keeps the metadata

    def discard_unfinished_uploads(self, uri: str) -> int:
        if not self.keeps_unfinished_uploads:
            return 0
        with self._bounded(uri, "discarding the unfinished uploads to"):
            return int(sync(self.fs.loop, self.parallel_object(uri).discard_unfinished))

    def delete(self, uri: str) -> None:
        with self._bounded(uri, "deleting"), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(uri)

    def list_prefix(self, uri: str) -> list[str]:
        with self._bounded(uri, "listing"):
            try:
                found = self.fs.find(uri.rstrip("/") + "/")
            except FileNotFoundError:
                return []
        return sorted(self.fs.unstrip_protocol(path) for path in found)

    def delete_prefix(self, uri: str) -> None:
        with self._bounded(uri, "deleting"):
            found = self.fs.find(uri.rstrip("/") + "/")
            if found:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(found)  # batched: one request per 1000 objects on S3
