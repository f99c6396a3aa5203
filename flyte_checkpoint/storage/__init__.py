"""Moving bytes to and from storage, one object at a time, atomically.

This package knows nothing of archive formats. It offers, for any supported URI, an atomic
writer (nothing is visible until commit), a streaming reader that verifies the recorded digest
at end of stream, object info, and copy. Local paths use the OS directly (:mod:`.stores.local`);
the object stores go through fsspec, one module per store with its parallel adapter
(:mod:`.stores.s3`, :mod:`.stores.gcs`, :mod:`.stores.azure`) on what they share
(:mod:`.stores.fsspec_store`), their bytes moved by :mod:`.parallel`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.storage.base import (
    COPY_CHUNK,
    DIGEST_KEY,
    FORMAT_KEY,
    FSYNC_OPTION,
    SIZE_KEY,
    Backend,
    ObjectInfo,
    ObjectWriter,
    VerifyingReader,
    copy_stream,
)
from flyte_checkpoint.storage.options import (
    STORES,
    TransferSettings,
    check_accepted_anywhere,
    split_transfer,
)
from flyte_checkpoint.storage.stores.local import LocalBackend
from flyte_checkpoint.uris import check_supported, is_local, scheme_of

StorageOptions = Mapping[str, Any]
"""Options for a store's client and for this package's transfers (``storage_options=``): what each
store accepts is listed in the documentation's storage options table, generated from
:func:`~flyte_checkpoint.storage.options.option_origins`."""

__all__ = [
    "COPY_CHUNK",
    "DIGEST_KEY",
    "FORMAT_KEY",
    "FSYNC_ENV",
    "FSYNC_OPTION",
    "SIZE_KEY",
    "Backend",
    "ObjectInfo",
    "ObjectWriter",
    "StorageOptions",
    "TransferSettings",
    "VerifyingReader",
    "backend_for",
    "check_transfer_settings",
    "copy_object",
]

FSYNC_ENV = "FLYTE_CHECKPOINT_FSYNC"
_LOCAL = {fsync: LocalBackend(fsync=fsync) for fsync in (False, True)}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def local_fsync(storage_options: StorageOptions | None, transfer: TransferSettings | None = None) -> bool:
    """Whether local writes fsync: ``transfer.fsync`` or the ``fsync`` storage option, else
    ``FLYTE_CHECKPOINT_FSYNC``."""
    given = transfer.fsync if transfer is not None else (storage_options or {}).get(FSYNC_OPTION)
    if isinstance(given, bool):
        return given
    if given is not None:
        raise ConfigurationError(f"storage option {FSYNC_OPTION!r} must be True or False, not {given!r}")
    raw = os.environ.get(FSYNC_ENV, "").strip().lower()
    if raw in _TRUE | _FALSE:
        return raw in _TRUE
    raise ConfigurationError(
        f"{FSYNC_ENV}={os.environ[FSYNC_ENV]!r} is not a yes/no value; set it to 1 (fsync every "
        "local checkpoint write) or 0 (the default: atomic, not synced to disk)"
    )


def check_local_options(options: StorageOptions, transfer: TransferSettings | None = None) -> None:
    """Refuse, for a local location, options no store accepts (a misspelling), invalid transfer
    settings, and a setting given both ways: caught on the laptop, not first in production on S3."""
    if not options:
        return
    check_accepted_anywhere(options, "any store (local disk takes the options of every store)")
    split_transfer(options, transfer, "local disk")


def check_transfer_settings(transfer: object) -> None:
    """Refuse a ``transfer=`` that is not ``None`` or a :class:`~.options.TransferSettings`,
    showing how to write it (a dict of settings is the usual slip)."""
    if transfer is not None and not isinstance(transfer, TransferSettings):
        raise ConfigurationError(_not_transfer_settings(transfer))


def _not_transfer_settings(given: object) -> str:
    if isinstance(given, Mapping):
        spelled = ", ".join(f"{key}={value!r}" for key, value in given.items())
        name = type(given).__name__
        return f"transfer= takes TransferSettings, not a {name}: write transfer=TransferSettings({spelled})"
    return f"transfer= takes TransferSettings(...), not {given!r}"


def backend_for(
    uri: str, storage_options: StorageOptions | None = None, *, transfer: TransferSettings | None = None
) -> Backend:
    """The backend that serves ``uri``; raises a clear error for unsupported schemes.

    ``transfer``: this package's settings (see :class:`~.options.TransferSettings`); without it
    they are read from ``storage_options``, as before.
    """
    check_supported(uri)
    check_transfer_settings(transfer)
    if is_local(uri):
        check_local_options(storage_options or {}, transfer)
        return _LOCAL[local_fsync(storage_options, transfer)]
    from flyte_checkpoint.storage.stores.fsspec_store import FsspecBackend

    module_name, _, class_name = STORES[scheme_of(uri)].partition(":")
    store: type[FsspecBackend] = getattr(importlib.import_module(module_name), class_name)
    return store(storage_options, transfer)


def copy_object(
    src: str,
    dst: str,
    *,
    src_options: StorageOptions | None = None,
    dst_options: StorageOptions | None = None,
    transfer: TransferSettings | None = None,
) -> bool:
    """Copy the object at ``src`` to ``dst`` atomically; ``False`` when ``src`` does not exist.

    Within one object store the copy happens server-side; otherwise the bytes stream through
    this process into an atomic write, verified against ``src``'s recorded digest. ``transfer``
    applies to both ends (see :func:`backend_for`).
    """
    source = backend_for(src, src_options, transfer=transfer)
    target = backend_for(dst, dst_options, transfer=transfer)
    both_local = isinstance(source, LocalBackend) and isinstance(target, LocalBackend)
    if both_local or (
        not isinstance(source, LocalBackend)
        and type(source) is type(target)
        and getattr(source, "fs", None) is getattr(target, "fs", None)
    ):
        if source.info(src) is None:
            return False
        target.copy(src, dst)
        return True
    reader = source.open_read(src)
    if reader is None:
        return False
    copy_stream(reader, target, dst)
    return True
