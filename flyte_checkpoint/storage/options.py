"""The storage options: which store takes which (the accepted-options table behind errors and the
docs), this package's own transfer settings, and checking them before any client is built: names and
values (a store's own checks of values its client would accept and fail on only later, such as
GCS's ``token``, live in its module in :mod:`~flyte_checkpoint.storage.stores`).

Every refusal is a :class:`~flyte_checkpoint.errors.ConfigurationError` naming the option and
what is accepted, on every backend: a misspelt option on local disk used to be accepted silently
and fail only in production on S3.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from pydantic import Field, ValidationError

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.storage.base import FSYNC_OPTION
from flyte_checkpoint.storage.deadline import TransferBound
from flyte_checkpoint.storage.retry import REQUEST_ATTEMPTS, RetryPolicy
from flyte_checkpoint.strict_settings import StrictSettings, unknown_option, validation_error

logger = logging.getLogger("flyte_checkpoint")

STORES = {
    **dict.fromkeys(("s3", "s3a"), "flyte_checkpoint.storage.stores.s3:S3Backend"),
    **dict.fromkeys(("gs", "gcs"), "flyte_checkpoint.storage.stores.gcs:GCSBackend"),
    **dict.fromkeys(("abfs", "abfss", "az"), "flyte_checkpoint.storage.stores.azure:AzureBackend"),
}
"""The backend class for each object-store URI scheme, one module per store, imported on first
use so that a local-only program never imports fsspec."""

REMOTE_STORES = ("s3", "gs", "abfs")
_MiB = 1 << 20


@functools.cache
def accepted_by(scheme: str) -> tuple[str, ...]:
    """The options ``scheme``'s store accepts; ``()`` when its extra is not installed."""
    try:
        return tuple(accepted_options(scheme))
    except ImportError:
        return ()


def own_options() -> frozenset[str]:
    """The storage options this package reads itself, whatever the store: known without
    importing any store's client."""
    return frozenset({FSYNC_OPTION, "max_concurrency", *TransferSettings.OPTIONS})


def accepted_anywhere() -> tuple[str, ...]:
    """Options some installed store accepts: what a local location tolerates, since one set of
    storage options often serves a local destination and a remote source together."""
    names = set(own_options())
    for scheme in REMOTE_STORES:
        names.update(accepted_by(scheme))
    return tuple(sorted(names))


def check_accepted_anywhere(options: Mapping[str, Any], where: str) -> None:
    """Refuse an option no installed store accepts (as :func:`check_names` with
    :func:`accepted_anywhere`), importing a store's client only while some name is still unknown.

    Listing a store's options imports its client (0.3-1 s each): a local save given only this
    package's options (``fsync``, ``part_size``) imports none, and one also given S3's ``key``
    stops at s3fs. Only a name no store accepts pays for every client, to suggest the closest.
    """
    unknown = set(options) - own_options()
    for scheme in REMOTE_STORES:
        if not unknown:
            return
        unknown.difference_update(accepted_by(scheme))
    if unknown:
        check_names(options, accepted_anywhere(), where)


def check_names(options: Mapping[str, Any], accepted: Iterable[str], where: str) -> None:
    """Refuse an option not in ``accepted``, suggesting the closest accepted name."""
    allowed = tuple(accepted)
    for name in options:
        if name not in allowed:
            raise unknown_option(str(name), allowed, where)


class TransferSettings(StrictSettings):
    """This package's own transfer settings: how parallel a save or load is (and so how much
    memory it holds, see :func:`~flyte_checkpoint.storage.parallel.sizing.transfer_memory`), how
    long it may take, and whether local writes are fsynced.

    Give them as ``transfer=TransferSettings(...)`` (to :class:`~flyte_checkpoint.Checkpoint`,
    the task context, the state and distributed managers, ``--transfer`` on the command line);
    ``storage_options`` then go to the store's client as given. The same names inside
    ``storage_options`` are still read (:meth:`from_storage_options`), for compatibility; giving
    one both ways is refused. Frozen and validated: a misspelt or invalid field raises
    :class:`~flyte_checkpoint.errors.ConfigurationError` naming it and what is accepted.
    """

    NOUN: ClassVar[str] = "transfer setting"

    max_concurrency: int = Field(default=8, ge=1, le=64)
    """Upload parts or download ranges in flight at once (storage option ``max_concurrency``)."""
    part_size: int = Field(default=8 * _MiB, ge=_MiB)
    """Bytes per upload part and the most per download range (storage option ``part_size``).
    Uploads of more than ``part_size`` times the store's part limit use larger parts, and fewer of
    them in flight; loads cut an object into equal ranges of at most this size, one per
    connection per round."""
    file_concurrency: int = Field(default=32, ge=1, le=256)
    """Upload parts in flight at once when a regular file is saved (storage option
    ``file_concurrency``). They are read from the file while they are sent and hold no buffer,
    so more of them cost connections, not memory (one read chunk and the socket's buffers each)."""
    part_attempts: int = Field(default=REQUEST_ATTEMPTS, ge=1)
    """Tries of one part or range, the first included, for failures the store's client did not
    retry itself: a response body cut off mid-way (resumed where it stopped) or an error raised
    outside the client. A request the client already retried (:func:`mark_retried_by_client`)
    is not tried again here, so the tries of one failing request stay ``REQUEST_ATTEMPTS`` per
    transfer attempt (see :mod:`flyte_checkpoint.storage.retry`)."""
    transfer_timeout: float | None = Field(default=None, gt=0)
    """Seconds a whole save or load may take before it is abandoned (and an upload aborted)
    with :class:`~flyte_checkpoint.errors.CheckpointTimeoutError` (storage option
    ``transfer_timeout``); ``None``: the default bound of :mod:`~flyte_checkpoint.storage.deadline`
    (120 s plus 1 s per MiB moved)."""
    stale_upload_age: float = Field(default=3600.0, ge=0)
    """Incomplete uploads to the same destination older than this many seconds are aborted by
    the next large save: they were left by a killed save (storage option ``stale_upload_age``)."""
    fsync: bool | None = Field(default=None, strict=True)
    """Whether writes to local disk are fsynced (the file, then its directory), durable against
    power loss; ``None``: as ``FLYTE_CHECKPOINT_FSYNC`` says (default off). Object stores ignore
    it: an upload is durable once complete (storage option ``fsync``)."""

    OPTIONS: ClassVar[tuple[str, ...]] = (
        "part_size",
        "file_concurrency",
        "part_attempts",
        "transfer_timeout",
        "stale_upload_age",
    )
    """Storage options that belong to this module alone (``max_concurrency`` is also s3fs's and
    adlfs's name for the same thing, so it is read but left for them)."""

    @classmethod
    def from_storage_options(cls, options: Mapping[str, Any]) -> tuple[TransferSettings, dict[str, Any]]:
        """The settings found in ``options``, and ``options`` without the keys only this module reads."""
        rest = dict(options)
        given = {key: rest.pop(key) for key in cls.OPTIONS if key in rest}
        if "max_concurrency" in rest:
            given["max_concurrency"] = rest["max_concurrency"]
        try:
            return cls(**given), rest
        except ConfigurationError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise exc.__cause__ from None  # worded by the caller, who knows the store
            raise

    def policy(self) -> RetryPolicy:
        """The retries of one part or range request (see :mod:`~flyte_checkpoint.storage.retry`)."""
        return RetryPolicy(attempts=self.part_attempts)

    def deadline(
        self, uri: str, action: str, loop: asyncio.AbstractEventLoop | None, size: int | None = None
    ) -> TransferBound:
        """The overall time bound of one save or load of ``size`` bytes (``None``: unknown yet)."""
        return TransferBound(uri, action, loop=loop, seconds=self.transfer_timeout, size=size)


def split_transfer(
    storage_options: Mapping[str, Any] | None, transfer: TransferSettings | None, where: str
) -> tuple[TransferSettings, dict[str, Any]]:
    """The transfer settings of one backend, and the options for its store's client.

    Without ``transfer`` the settings are read from ``storage_options`` (the older spelling,
    kept for compatibility), and the keys only this package reads are taken out. With it,
    ``storage_options`` are the client's as given, and may not hold any of those keys (nor
    ``fsync``): a setting given both ways is refused rather than one of them silently ignored.
    """
    options = dict(storage_options or {})
    if transfer is None:
        try:
            return TransferSettings.from_storage_options(options)
        except ValidationError as exc:
            raise validation_error(exc, where) from None
    both = [name for name in (*TransferSettings.OPTIONS, FSYNC_OPTION) if name in options]
    if both:
        raise ConfigurationError(
            f"{', '.join(map(repr, both))} given both in storage_options and as transfer="
            f"TransferSettings(...) for {where}; give each setting once, in transfer= (the storage "
            "option spelling is the older one)"
        )
    return transfer, options


_FSSPEC_OPTIONS = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)


def accepted_options(scheme: str) -> list[str]:
    """The storage options the store of ``scheme`` accepts: what its fsspec implementation names
    in its constructors (up the class hierarchy while one passes ``**kwargs`` on, as gcsfs's
    extended class does), fsspec's own, and this package's (transfer settings, ``fsync``)."""
    return sorted(option_origins(scheme))


def option_origins(scheme: str) -> dict[str, str]:
    """Each storage option the store of ``scheme`` accepts, and what reads it: the implementing
    class (``module.Class``), ``"fsspec"``, or ``"flyte_checkpoint"``. The one list behind both
    :func:`accepted_options` (the "Accepted:" of an error) and the documentation's table."""
    module_name, _, class_name = STORES[scheme].partition(":")
    profile = getattr(importlib.import_module(module_name), class_name).profile
    implementation_module, _, implementation_name = profile.implementation.partition(":")
    implementation = getattr(importlib.import_module(implementation_module), implementation_name)
    origins: dict[str, str] = {}
    for cls in implementation.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        for p in parameters:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                origins.setdefault(p.name, f"{cls.__module__.partition('.')[0]}.{cls.__qualname__}")
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    origins.update(dict.fromkeys(_FSSPEC_OPTIONS, "fsspec"))
    client = f"{implementation.__module__.partition('.')[0]}.{implementation.__qualname__}"
    given = {**profile.defaults, **profile.own_options}
    origins.update({name: f"{client} (default here: {value!r})" for name, value in given.items()})
    # Ours last: these are read (and some taken away) before the client sees the options.
    origins.update(dict.fromkeys(own_options(), "flyte_checkpoint"))
    return origins
