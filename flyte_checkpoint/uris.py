"""Storage URI normalisation and the previous-attempt URI repair."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from flyte_checkpoint.context import ATTEMPT_NUMBER_ENV, attempt_number_from_env, ctx
from flyte_checkpoint.errors import UnsupportedURIError

__all__ = [
    "ATTEMPT_NUMBER_ENV",
    "attempt_number_from_env",
    "check_object_uri",
    "check_supported",
    "clean_uri",
    "container_and_key",
    "current_attempt_number",
    "is_local",
    "local_path",
    "repair_prev_checkpoint_uri",
    "scheme_of",
]

LOCAL_SCHEMES = frozenset({"", "file", "local"})
REMOTE_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az"})
# The schemes for which an executor may hand over a previous-attempt URI that points at the
# *current* attempt's directory (see :func:`repair_prev_checkpoint_uri`).
REPAIRABLE_SCHEMES = frozenset({"s3", "gs", "gcs", "s3a", "abfss", "az"})


def clean_uri(value: str | None) -> str | None:
    """Strip whitespace and surrounding quotes; an empty result means "no location" (``None``)."""
    if value is None:
        return None
    cleaned = value.strip().strip("\"'").strip()
    return cleaned or None


def scheme_of(uri: str) -> str:
    """The lower-case scheme of ``uri``; ``""`` for a plain local path."""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    return match.group(1).lower() if match else ""


def is_local(uri: str) -> bool:
    """Whether ``uri`` names a local path (a plain path or a ``file://`` URI)."""
    return scheme_of(uri) in LOCAL_SCHEMES


def _check_scheme(uri: str) -> str:
    """Return the scheme of ``uri``, or raise :class:`UnsupportedURIError` naming the supported ones."""
    scheme = scheme_of(uri)
    if scheme not in LOCAL_SCHEMES | REMOTE_SCHEMES:
        supported = ", ".join(f"{s}://" for s in sorted(REMOTE_SCHEMES | {"file"}))
        raise UnsupportedURIError(
            f"unsupported storage URI {uri!r}: scheme {scheme!r} is not one of {supported}, "
            "or a plain local path"
        )
    return scheme


def container_and_key(uri: str) -> tuple[str, str]:
    """The bucket (or container) and the key of a remote ``uri``; either may be empty."""
    rest = uri.split("://", 1)[1]
    netloc, _, key = rest.partition("/")
    # abfs://container@account.dfs.core.windows.net/key names the account after the container.
    return netloc.partition("@")[0], key


def check_supported(uri: str) -> str:
    """Return the scheme of ``uri``, or raise :class:`UnsupportedURIError`.

    Refused: a scheme this package does not handle, and a remote URI without a bucket or
    container (``s3:///key``), which no store can serve.
    """
    scheme = _check_scheme(uri)
    if scheme in REMOTE_SCHEMES and not container_and_key(uri)[0]:
        raise UnsupportedURIError(
            f"storage URI {uri!r} names no bucket or container; write {scheme}://BUCKET/path/to/checkpoint"
        )
    return scheme


def check_object_uri(uri: str) -> str:
    """Return the scheme of ``uri`` if it can name one checkpoint object, else raise
    :class:`UnsupportedURIError` saying how to write it.

    Besides :func:`check_supported`'s rules, a remote object URI needs a key under its bucket
    (``s3://bucket`` and ``s3://bucket/`` name the whole bucket) and must not end in ``/``: a
    store would keep ``run/ckpt`` and ``run/ckpt/`` as two different objects (one save could land
    in one and the next load read the other, silently finding nothing), so a trailing slash is
    refused everywhere an object is named rather than quietly dropped in some places. A local
    path may end in ``/``: the operating system reads ``ckpt/`` and ``ckpt`` as the same file.
    """
    scheme = check_supported(uri)
    if scheme not in REMOTE_SCHEMES:
        return scheme
    bucket, key = container_and_key(uri)
    if not key.strip("/"):
        raise UnsupportedURIError(
            f"storage URI {uri!r} names the whole bucket {bucket!r}, not an object in it; add the "
            f"object's key, e.g. {scheme}://{bucket}/run/checkpoint"
        )
    if key.endswith("/"):
        raise UnsupportedURIError(
            f"storage URI {uri!r} ends in '/', which names a folder, not an object; a checkpoint "
            f"is one object: drop the trailing slash ({uri.rstrip('/')})"
        )
    return scheme


def local_path(uri: str) -> Path:
    """The filesystem path of a local ``uri`` (plain path or ``file://`` URI), made absolute."""
    scheme = scheme_of(uri)
    if scheme not in LOCAL_SCHEMES:
        raise UnsupportedURIError(f"{uri!r} is not a local path or file:// URI")
    if not scheme:
        return Path(uri).expanduser().absolute()
    parts = urlsplit(uri)
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedURIError(f"file URI {uri!r} names host {parts.netloc!r}; use file:///absolute/path")
    return Path(unquote(parts.path)).absolute()


def current_attempt_number() -> int:
    """The running task's attempt number: its :class:`TaskContext`'s, else ``FLYTE_ATTEMPT_NUMBER``."""
    context = ctx()
    return context.attempt_number if context is not None else attempt_number_from_env()


def repair_prev_checkpoint_uri(
    prev_uri: str,
    *,
    run_name: str | None = None,
    action_name: str | None = None,
    attempt_number: int | None = None,
) -> str:
    """Point a previous-attempt URI at the previous attempt's directory when it names the current one.

    Some executors build the previous checkpoint URI from the *current* attempt directory
    (``…/{run_name}/{action_name}/{n}/…``). For the remote schemes ``s3://``, ``gs://``,
    ``gcs://``, ``s3a://``, ``abfss://`` and ``az://`` this rewrites ``n`` to ``n - 1`` when
    ``n > 1`` and either ``FLYTE_ATTEMPT_NUMBER`` is unset or below 1, or ``n`` equals
    ``FLYTE_ATTEMPT_NUMBER`` or ``FLYTE_ATTEMPT_NUMBER + 1``. Anything else (local paths, no
    run or action name, no matching segment, a mismatched segment, ``n <= 1``) is returned as is.
    """
    if scheme_of(prev_uri) not in REPAIRABLE_SCHEMES or not run_name or not action_name:
        return prev_uri
    pattern = re.compile(rf"/{re.escape(run_name)}/{re.escape(action_name)}/(\d+)/")
    match = pattern.search(prev_uri)
    if match is None:
        return prev_uri
    segment = int(match.group(1))
    if segment <= 1:
        return prev_uri
    attempt = current_attempt_number() if attempt_number is None else attempt_number
    if attempt >= 1 and segment not in (attempt, attempt + 1):
        return prev_uri
    start, end = match.span(1)
    return f"{prev_uri[:start]}{segment - 1}{prev_uri[end:]}"
