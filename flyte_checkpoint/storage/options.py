"""Checking storage options before any client is built: names, values, and the few that fsspec
implementations would otherwise accept and fail on only later (or never).

Every refusal is a :class:`~flyte_checkpoint.errors.ConfigurationError` naming the option and
what is accepted, on every backend: a misspelt option on local disk used to be accepted silently
and fail only in production on S3.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from flyte_checkpoint.errors import ConfigurationError

logger = logging.getLogger("flyte_checkpoint")

REMOTE_STORES = ("s3", "gs", "abfs")
_GCSFS_TOKEN_WORDS = frozenset({"google_default", "cache", "anon", "browser", "cloud"})


@functools.cache
def accepted_by(scheme: str) -> tuple[str, ...]:
    """The options ``scheme``'s store accepts; ``()`` when its extra is not installed."""
    from flyte_checkpoint.storage.remote_errors import accepted_options

    try:
        return tuple(accepted_options(scheme))
    except ImportError:
        return ()


def accepted_anywhere() -> tuple[str, ...]:
    """Options some installed store accepts: what a local location tolerates, since one set of
    storage options often serves a local destination and a remote source together."""
    from flyte_checkpoint.storage.base import FSYNC_OPTION
    from flyte_checkpoint.storage.parallel import TransferSettings

    names = {FSYNC_OPTION, "max_concurrency", *TransferSettings.OPTIONS}
    for scheme in REMOTE_STORES:
        names.update(accepted_by(scheme))
    return tuple(sorted(names))


def check_names(options: Mapping[str, Any], accepted: Iterable[str], where: str) -> None:
    """Refuse an option not in ``accepted``, suggesting the closest accepted name."""
    allowed = tuple(accepted)
    for name in options:
        if name not in allowed:
            raise unknown_option(str(name), allowed, where)


def unknown_option(name: str, accepted: Sequence[str], where: str) -> ConfigurationError:
    """The error for storage option ``name``, which ``where`` does not accept (empty ``accepted``:
    the list could not be had)."""
    close = difflib.get_close_matches(name, accepted, n=1)
    suggestion = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(accepted) or "see the fsspec implementation's documentation"
    return ConfigurationError(
        f"storage option {name!r} is not accepted by {where}{suggestion}; check its spelling or "
        f"remove it. Accepted: {listed}"
    )


def validation_error(exc: ValidationError, where: str) -> ConfigurationError:
    """The :class:`ConfigurationError` for a transfer setting pydantic refused."""
    problems = "; ".join(
        f"storage option {'.'.join(str(part) for part in error['loc'])!r}={error.get('input')!r}: "
        f"{error['msg']}"
        for error in exc.errors()
    )
    return ConfigurationError(f"invalid storage options for {where}: {problems}")


def check_gcs_token(options: Mapping[str, Any]) -> None:
    """Refuse a ``token`` naming a file that does not exist: gcsfs then falls back to Google's
    token endpoint and fails with a ``requests.ConnectionError`` (or, online, a confusing 401)."""
    token = options.get("token")
    if not isinstance(token, str | os.PathLike) or str(token) in _GCSFS_TOKEN_WORDS:
        return
    path = os.fspath(token)
    if not os.path.exists(path):
        raise ConfigurationError(
            f"storage option 'token' names {path!r}, which does not exist; give the path of a "
            "service-account JSON file, a dict of its contents, or one of "
            f"{', '.join(sorted(_GCSFS_TOKEN_WORDS))} (or leave it out to use "
            "GOOGLE_APPLICATION_CREDENTIALS)"
        )


def constructor_error(exc: ValueError, scheme: str) -> ConfigurationError:
    """The :class:`ConfigurationError` for a client constructor refusing its options (adlfs: a
    malformed connection string, an account name without credentials or host)."""
    return ConfigurationError(
        f"the {scheme}:// storage options were refused by its client: {exc}; check "
        "connection_string (DefaultEndpointsProtocol=...;AccountName=...;AccountKey=...;"
        "BlobEndpoint=...) or account_name with account_key, sas_token or credential"
        if scheme == "abfs"
        else f"the {scheme}:// storage options were refused by its client: {exc}"
    )
