"""Where an incremental checkpoint's chunks and pending-save markers live.

Chunks are shared by every save and every attempt of one checkpoint, so they cannot live under
an attempt's directory. For a checkpoint in a per-attempt layout
(:func:`~flyte_checkpoint.uris.attempt_uris`: ``…/{run}/{action}/{n}/{rest}``) the chunk store
is ``…/{run}/{action}/.flyte-checkpoint-chunks/{rest}/``: beside the attempt directories, shared
by all of them, and apart for each checkpoint name (so one checkpoint's garbage collection never
sees another's chunks). Anywhere else it is ``{checkpoint}.chunks/``, beside the object.

The manifest records the store relative to its own directory, so a copy of the run's whole tree
(or a load of an earlier attempt's manifest) finds its chunks without knowing the run's names.
"""

from __future__ import annotations

import posixpath

from flyte_checkpoint.uris import shared_by_attempts

STORE_DIRECTORY = ".flyte-checkpoint-chunks"
"""The directory, beside the attempt directories, holding every chunk store of an action."""
CHUNKS = "sha256"
"""The folder of a store holding chunks: ``{store}/sha256/{first two hex digits}/{digest}``."""
PENDING = "pending"
"""The folder of a store holding the markers of saves in progress (see :mod:`.gc`)."""


def chunk_store_for(uri: str, *, run_name: str | None, action_name: str | None) -> str:
    """The chunk store (a directory-like prefix, no trailing slash) of the checkpoint at ``uri``."""
    shared = shared_by_attempts(uri, run_name=run_name, action_name=action_name)
    if shared is None:
        return f"{uri.rstrip('/')}.chunks"
    head, rest = shared
    return f"{head}{STORE_DIRECTORY}/{rest.strip('/')}"


def chunk_uri(store: str, digest: str) -> str:
    """The object holding the chunk whose SHA-256 is the hex ``digest``."""
    return f"{store}/{CHUNKS}/{digest[:2]}/{digest}"


def digest_of_chunk_uri(uri: str) -> str | None:
    """The hex digest a chunk object's URI names; ``None`` for anything else in the store."""
    name = uri.rstrip("/").rpartition("/")[2]
    if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    return None


def _split(uri: str) -> tuple[str, str]:
    scheme, sep, rest = uri.partition("://")
    return (scheme + sep, rest) if sep else ("", uri)


def relative_store(manifest_uri: str, store: str) -> str:
    """``store`` as the manifest records it: relative to the manifest's directory."""
    _, manifest_path = _split(manifest_uri)
    _, store_path = _split(store)
    return posixpath.relpath(store_path, posixpath.dirname(manifest_path) or ".")


def resolve_store(manifest_uri: str, recorded: str) -> str:
    """The chunk store a manifest at ``manifest_uri`` recorded as ``recorded``."""
    scheme, manifest_path = _split(manifest_uri)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(manifest_path) or ".", recorded))
    if manifest_path.startswith("//") and not joined.startswith("//"):
        joined = "/" + joined  # normpath keeps a leading "//" but we never write one
    return scheme + joined
