"""Storage URI normalisation and the previous-attempt URI repair.

No task-context import: the attempt number is passed in (or read from ``FLYTE_ATTEMPT_NUMBER``),
so this module sits below the checkpoint helper and the storage layer without a cycle.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, NamedTuple
from urllib.parse import unquote, urlsplit

from flyte_checkpoint.environment import ATTEMPT_NUMBER_ENV, attempt_number_from_env
from flyte_checkpoint.errors import UnsupportedURIError

__all__ = [
    "ATTEMPT_NUMBER_ENV",
    "AttemptURI",
    "attempt_number_from_env",
    "attempt_uris",
    "check_object_uri",
    "check_supported",
    "clean_uri",
    "container_and_key",
    "flyte_shard",
    "is_local",
    "local_path",
    "repair_prev_checkpoint_uri",
    "scheme_of",
    "shared_by_attempts",
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

    Refused: an empty URI (never read as the current directory), a scheme this package does not
    handle, and a remote URI without a bucket or container (``s3:///key``), or with one no store
    accepts (``s3://bu cket/key``), which no store can serve.
    """
    if not uri.strip():
        raise UnsupportedURIError(
            "the storage URI is empty; give a local path or a URI such as s3://bucket/run/checkpoint"
        )
    scheme = _check_scheme(uri)
    if scheme in REMOTE_SCHEMES:
        _check_container(uri, scheme)
    return scheme


_CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What S3, GCS and Azure all accept in a bucket or container name, at its loosest (each store
has stricter rules of its own, which it enforces): botocore's own check, less the leading
punctuation no store takes. Access point ARNs (``s3://arn:aws:s3:...:accesspoint/name/key``) and
Azure's ``$root``, ``$web`` and ``$logs`` containers are let through."""
_AZURE_SCHEMES = frozenset({"abfs", "abfss", "az"})


def _check_container(uri: str, scheme: str) -> None:
    container = container_and_key(uri)[0]
    noun = "container" if scheme in _AZURE_SCHEMES else "bucket"
    if not container:
        raise UnsupportedURIError(
            f"storage URI {uri!r} names no bucket or container; write {scheme}://BUCKET/path/to/checkpoint"
        )
    if container.startswith("arn:") or (scheme in _AZURE_SCHEMES and container in ("$root", "$web", "$logs")):
        return  # an S3 access point's ARN (s3fs reads its own syntax), or Azure's special containers
    if not _CONTAINER_NAME.match(container) or len(container) > 255:
        raise UnsupportedURIError(
            f"storage URI {uri!r} names the {noun} {container!r}, which is not a valid {noun} name: "
            f"a {noun} name is letters, digits, '.', '-' and '_', starting with a letter or digit, "
            "with no spaces or other characters; correct it in the URI"
        )


def check_object_uri(uri: str) -> str:
    """Return the scheme of ``uri`` if it can name one checkpoint object, else raise
    :class:`UnsupportedURIError` saying how to write it.

    Besides :func:`check_supported`'s rules, a remote object URI needs a key under its bucket
    (``s3://bucket`` and ``s3://bucket/`` name the whole bucket), and no object URI may end in
    ``/``: a store would keep ``run/ckpt`` and ``run/ckpt/`` as two different objects (one save
    could land in one and the next load read the other, silently finding nothing), and on local
    disk ``ckpt/`` reads as a directory while a save quietly wrote a file of that name. So a
    trailing slash is refused on every store, everywhere an object is named.
    """
    scheme = check_supported(uri)
    if scheme not in REMOTE_SCHEMES:
        if uri.endswith("/"):
            raise UnsupportedURIError(
                f"checkpoint location {uri!r} ends in '/', which names a directory, not a file; a "
                "checkpoint is one file (a directory is saved as one .tar.gz in it): drop the "
                f"trailing slash ({uri.rstrip('/') or '/...'}), or name a file inside the directory "
                f"({uri}checkpoint)"
            )
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
    ``n > 1`` and ``n`` equals the attempt number or the attempt number + 1: ``attempt_number``,
    else ``FLYTE_ATTEMPT_NUMBER`` (0 when unset, so that only ``n <= 1`` could match, and those
    are never rewritten). Anything else (local paths, no run or action name, no matching
    segment, a mismatched segment, ``n <= 1``) is returned as is: a segment that does not match
    a known attempt number says nothing about which attempt wrote it, and rewriting a correct
    URI would point the load at an attempt that never saved there.

    A URI in Flyte's sharded layout (see :func:`attempt_uris`) whose directory already agrees
    with the attempt its unique id names (``…/{n}/{shard}/{run}-{action}-{n-1}/…``) is returned
    as is too: it names the attempt that wrote it, so decrementing ``n`` would point at a
    directory that attempt never wrote (with a 0-based attempt number, ``n`` of a correct
    previous URI equals the current attempt number).
    """
    if scheme_of(prev_uri) not in REPAIRABLE_SCHEMES or not run_name or not action_name:
        return prev_uri
    located = _locate_attempt(prev_uri, run_name, action_name)
    if located is None or located.layout == "flyte":
        return prev_uri
    segment = located.number
    if segment <= 1:
        return prev_uri
    attempt = attempt_number_from_env() if attempt_number is None else attempt_number
    if segment not in (attempt, attempt + 1):
        return prev_uri
    return f"{located.head}{segment - 1}/{located.rest}"


# -- earlier attempts ----------------------------------------------------------------------------

_SHARD_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"
_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193


def flyte_shard(unique_id: str) -> str:
    """The two-character shard Flyte puts in front of ``unique_id`` in a raw-data path.

    Flyte's base-36 shard selector: the 32-bit FNV-1a hash of the id, modulo the 36 x 36 pairs
    of ``a``-``z`` then ``0``-``9`` (``"r969nmh2r5m6mqqnnb4h-a0-0"`` is in shard ``"ge"``).
    """
    value = _FNV32_OFFSET
    for byte in unique_id.encode():
        value = ((value ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    first, second = divmod(value % len(_SHARD_CHARS) ** 2, len(_SHARD_CHARS))
    return _SHARD_CHARS[first] + _SHARD_CHARS[second]


class AttemptURI(NamedTuple):
    """A checkpoint URI and the attempt directory number it lies under (``None``: not known)."""

    attempt: int | None
    uri: str


_Layout = Literal["plain", "flyte", "opaque"]


class _Located(NamedTuple):
    head: str
    """Everything up to and including ``/{run}/{action}/``."""
    number: int
    """The attempt directory ``n``."""
    rest: str
    """Everything after ``{n}/``."""
    layout: _Layout


def _locate_attempt(uri: str, run_name: str, action_name: str) -> _Located | None:
    """Split ``uri`` around its first ``/{run}/{action}/{n}/``, or ``None`` when it has none.

    The layout is ``"flyte"`` when the next two segments are ``{shard}/{run}-{action}-{n-1}``
    with Flyte's shard of that id, ``"opaque"`` when they are a Flyte shard and some other id
    (the id of another attempt, or one Flyte shortened to a hash), and ``"plain"`` otherwise.
    """
    pattern = re.compile(rf"/{re.escape(run_name)}/{re.escape(action_name)}/(\d+)/")
    match = pattern.search(uri)
    if match is None:
        return None
    head, number, rest = uri[: match.start(1)], int(match.group(1)), uri[match.end() :]
    shard, _, after = rest.partition("/")
    unique_id = after.partition("/")[0] if "/" in after else None
    if unique_id is None or shard != flyte_shard(unique_id):
        return _Located(head, number, rest, "plain")
    if unique_id == _flyte_unique_id(run_name, action_name, number):
        return _Located(head, number, rest, "flyte")
    return _Located(head, number, rest, "opaque")


def _flyte_unique_id(run_name: str, action_name: str, number: int) -> str:
    """The unique id Flyte gives the attempt under directory ``number`` (which counts from 1)."""
    return f"{run_name}-{action_name}-{number - 1}"


def attempt_uris(
    prev_uri: str,
    *,
    run_name: str | None,
    action_name: str | None,
    earlier: int,
) -> list[AttemptURI]:
    """``prev_uri`` and the same checkpoint of up to ``earlier`` attempts before it, newest first.

    Pure: no storage is asked and no context is read. The URIs of earlier attempts are derived
    for local paths, ``file://`` URIs and the remote schemes of
    :func:`repair_prev_checkpoint_uri`, with both names given, and for the two per-attempt
    layouts it knows; otherwise the list holds ``prev_uri`` alone (its attempt ``None`` when it
    has no attempt directory). The layouts:

    * Flyte's (what ``--checkpoint-path`` and ``--prev-checkpoint`` of ``flyte/_bin/runtime.py``
      receive, templated by the backend from ``{{.checkpointOutputPrefix}}`` and
      ``{{.prevCheckpointPrefix}}``): the checkpoint object of 0-based attempt ``k`` is
      ``{raw data prefix}/{run}/{action}/{k+1}/{shard}/{run}-{action}-{k}/_flytecheckpoints``,
      e.g. ``s3://bucket/ns/prefix/r969nmh2r5m6mqqnnb4h/a0/1/ge/r969nmh2r5m6mqqnnb4h-a0-0/
      _flytecheckpoints``, where ``{shard}`` is :func:`flyte_shard` of the unique id after it.
      An earlier attempt changes all three: the directory, the id and its shard. Directories
      count from 1, so the walk ends at directory 1 (attempt 0).
    * plain: ``…/{run}/{action}/{n}/…`` with nothing else naming the attempt (such as
      ``…/{run}/{action}/{n}/_flytecheckpoints``); an earlier attempt changes ``n`` only, down
      to 0.

    A URI whose attempt directory is followed by a Flyte shard and an id of another attempt
    (or an id Flyte shortened to a hash) cannot be walked back: the list holds it alone.
    """
    walkable = scheme_of(prev_uri) in REPAIRABLE_SCHEMES or is_local(prev_uri)
    if not walkable or not run_name or not action_name:
        return [AttemptURI(None, prev_uri)]
    located = _locate_attempt(prev_uri, run_name, action_name)
    if located is None:
        return [AttemptURI(None, prev_uri)]
    found = [AttemptURI(located.number, prev_uri)]
    if located.layout == "opaque":
        return found
    lowest = 1 if located.layout == "flyte" else 0
    for number in range(located.number - 1, max(lowest, located.number - earlier) - 1, -1):
        found.append(AttemptURI(number, _with_attempt(located, number, run_name, action_name)))
    return found


def shared_by_attempts(uri: str, *, run_name: str | None, action_name: str | None) -> tuple[str, str] | None:
    """``uri`` split into the directory every attempt of its action shares (``…/{run}/{action}/``)
    and the checkpoint's path below its attempt directory without what names the attempt (a
    Flyte shard and unique id); ``None`` outside the layouts of :func:`attempt_uris`."""
    if not run_name or not action_name:
        return None
    located = _locate_attempt(uri, run_name, action_name)
    if located is None or located.layout == "opaque":
        return None
    rest = located.rest if located.layout == "plain" else located.rest.split("/", 2)[2]
    return located.head, rest


def _with_attempt(located: _Located, number: int, run_name: str, action_name: str) -> str:
    if located.layout == "plain":
        return f"{located.head}{number}/{located.rest}"
    rest = located.rest.split("/", 2)[2]  # drop the shard and the unique id
    unique_id = _flyte_unique_id(run_name, action_name, number)
    return f"{located.head}{number}/{flyte_shard(unique_id)}/{unique_id}/{rest}"
