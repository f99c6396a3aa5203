"""Translation of backend and OS errors into this package's typed errors, at one boundary: the
one module that does it, for local disk (``OSError``) and for the object stores.

s3fs / gcsfs / adlfs errors:
The backends raise a zoo of types (botocore, aiohttp, azure-core, fsspec, plain ``OSError`` and
even ``RuntimeError`` wrapping the real cause), and importing them would make the optional
extras mandatory. So errors are recognised by the *names* of their classes along the exception
chain, at this one boundary, the way httpx's ``map_exceptions`` does it for its transports.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

from flyte_checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointPermissionError,
    CheckpointStorageError,
    CheckpointUnavailableError,
    ConfigurationError,
)
from flyte_checkpoint.storage.options import accepted_options
from flyte_checkpoint.strict_settings import unknown_option
from flyte_checkpoint.uris import container_and_key

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.EPIPE,
        errno.EAGAIN,
    }
)


_READING_ACTIONS = frozenset({"reading", "loading", "inspecting", "listing"})
"""Actions that only read: a refusal there is about read permission, not a place to write."""


def os_error_to_checkpoint_error(exc: OSError, uri: str, action: str) -> CheckpointError:
    """The typed error for an ``OSError`` raised while ``action`` (e.g. "saving") ``uri``."""
    if isinstance(exc, CheckpointError):
        return exc
    if exc.errno == errno.EROFS:  # no permission or credential can fix a read-only mount
        return CheckpointStorageError(
            f"read-only filesystem {action} {uri}: {exc.strerror or exc}; the location is on a "
            "file system mounted read-only: choose a location on a writable one"
        )
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM):
        if action in _READING_ACTIONS:
            advice = "check that the process may read it (file and directory permissions)"
        else:
            advice = (
                "check that the process may write there (file and directory permissions) "
                "or choose another location"
            )
        return CheckpointPermissionError(f"permission denied {action} {uri}: {exc.strerror or exc}; {advice}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        if action.startswith("restoring"):
            temp = tempfile.gettempdir()
            return CheckpointStorageError(
                f"out of space {action} {uri}: {exc.strerror or exc}; nothing was restored and the "
                f"stored checkpoint is unchanged. The restore workspace is in TMPDIR ({temp}): free "
                "space there, or set TMPDIR to a directory on a larger disk, then load again"
            )
        return CheckpointStorageError(
            f"out of space {action} {uri}: {exc.strerror or exc}; the previous checkpoint is "
            "untouched; free space or raise the quota, then save again"
        )
    if isinstance(exc, TimeoutError | ConnectionError) or exc.errno in _TRANSIENT_ERRNOS:
        return CheckpointUnavailableError(f"storage unavailable {action} {uri}: {exc}")
    if isinstance(exc, FileNotFoundError) and action.startswith("restoring"):
        # Writing the restored files: what is missing is a directory to write into (or one the
        # file system will not create, as in /proc), never the checkpoint, which was read.
        return CheckpointStorageError(
            f"cannot write {uri} ({action}): {exc.strerror or exc}; a directory on its path does "
            "not exist or cannot hold new entries: restore into a writable directory"
        )
    if isinstance(exc, FileNotFoundError):
        return CheckpointNotFoundError(f"not found {action} {uri}: {exc}")
    if isinstance(exc, NotADirectoryError) or exc.errno == errno.ENOTDIR:
        return CheckpointStorageError(
            f"cannot use {uri} ({action}): a parent of it is a file, not a directory"
        )
    if isinstance(exc, IsADirectoryError) or exc.errno == errno.EISDIR:
        return CheckpointStorageError(
            f"cannot use {uri} ({action}): it is a directory; a checkpoint location names a "
            "single object, e.g. .../checkpoint"
        )
    return CheckpointStorageError(f"storage error {action} {uri}: {exc}")


class translated_os_errors:  # lower case, like contextlib.suppress: it replaced a function
    """Re-raise any ``OSError`` inside the block as the matching :class:`CheckpointError`.

    A class, not ``@contextmanager``: it wraps every write of a save, and a generator-based
    context manager cost a few microseconds each time, a noticeable share of a 1 KiB save.
    """

    __slots__ = ("_action", "_uri")

    def __init__(self, uri: str, action: str) -> None:
        self._uri = uri
        self._action = action

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, CheckpointError):
            raise os_error_to_checkpoint_error(exc, self._uri, self._action) from exc


# -- the object stores' errors ----------------------------------------------------------------

logger = logging.getLogger("flyte_checkpoint")

Kind = Literal["absent", "transient", "permission"]

_TRANSIENT_TYPES = frozenset(
    {
        # botocore
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ResponseStreamingError",
        "IncompleteReadError",
        # aiohttp / asyncio / fsspec
        "ClientConnectorError",
        "ClientConnectionError",
        "ClientOSError",
        "ServerDisconnectedError",
        "ClientPayloadError",
        "ServerTimeoutError",
        "FSTimeoutError",
        "TimeoutError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "ConnectionAbortedError",
        "BrokenPipeError",
        "IncompleteRead",
        # s3fs: the object changed between two range reads (a concurrent replace); a retry
        # reads the new object whole
        "FileExpired",
        # azure-core
        "ServiceRequestError",
        "ServiceResponseError",
        "ServiceRequestTimeoutError",
        "ServiceResponseTimeoutError",
    }
)
_PERMISSION_TYPES = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "ClientAuthenticationError", "RefreshError"}
)
_ABSENT_TYPES = frozenset({"NoSuchKey", "NoSuchBucket", "ResourceNotFoundError"})
_ABSENT_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "ContainerNotFound", "BlobNotFound"})
_NO_CONTAINER_CODES = frozenset({"NoSuchBucket", "ContainerNotFound"})
_CONTAINER_WORD = {"abfs": "container", "abfss": "container", "az": "container"}
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "ServerBusy",
        "OperationTimedOut",
        "PreconditionFailed",
        "ConditionNotMet",
    }
)
_PERMISSION_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AuthorizationFailure",
        "AuthenticationFailed",
        "AuthorizationPermissionMismatch",
    }
)

# What to set, per scheme, when credentials are missing or refused.
CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for "
    "an S3-compatible server, or pass storage_options={'key': ..., 'secret': ..., 'endpoint_url': ...}",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account file (or STORAGE_EMULATOR_HOST for an "
    "emulator), or pass storage_options={'token': ...}",
    "abfs": "set AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and "
    "AZURE_STORAGE_ACCOUNT_KEY), or pass storage_options={'connection_string': ...}",
}
CREDENTIAL_HINTS["s3a"] = CREDENTIAL_HINTS["s3"]
CREDENTIAL_HINTS["gcs"] = CREDENTIAL_HINTS["gs"]
CREDENTIAL_HINTS["abfss"] = CREDENTIAL_HINTS["az"] = CREDENTIAL_HINTS["abfs"]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _interpreter_shutting_down(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a thread pool refusing work because the interpreter is exiting
    (never transient: retrying only spends the time the process has left)."""
    return any(
        isinstance(link, RuntimeError) and "cannot schedule new futures after" in str(link)
        for link in _chain(exc)
    )


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        error = response.get("Error", {})
        metadata = response.get("ResponseMetadata", {})
        status = metadata.get("HTTPStatusCode")
        return (int(status) if status else None), error.get("Code")
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None) or getattr(exc, "code", None)
    code = getattr(exc, "error_code", None)
    return (status if isinstance(status, int) else None), (str(code) if code else None)


def classify(exc: BaseException) -> Kind | None:
    """Whether ``exc`` means the object is absent, a transient failure, or refused access."""
    for link in _chain(exc):
        name = type(link).__name__
        status, code = _status_and_code(link)
        if name in _PERMISSION_TYPES or code in _PERMISSION_CODES or status in (401, 403):
            return "permission"
        if name in _ABSENT_TYPES or code in _ABSENT_CODES:
            return "absent"
        if name in _TRANSIENT_TYPES or code in _TRANSIENT_CODES:
            return "transient"
        if status is not None and (status >= 500 or status in (408, 412, 429)):
            return "transient"
        if isinstance(link, PermissionError):
            return "permission"
        if isinstance(link, FileNotFoundError):
            return "absent"
        if isinstance(link, ConnectionError | TimeoutError):
            return "transient"
    return None


def missing_container_error(uri: str, action: str, scheme: str) -> ConfigurationError:
    """The error for a bucket (container) that does not exist: a configuration mistake, never
    "no checkpoint", which would make a task start from zero on every attempt."""
    noun = _CONTAINER_WORD.get(scheme, "bucket")
    container = container_and_key(uri)[0]
    return ConfigurationError(
        f"the {noun} {container!r} does not exist ({action} {uri}); create it, or correct the "
        f"{noun} name in the checkpoint URI (and the endpoint or account in storage_options)"
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


def _names_missing_container(exc: BaseException) -> bool:
    return any(_status_and_code(link)[1] in _NO_CONTAINER_CODES for link in _chain(exc))


def confirm_absent(fs: Any, uri: str, action: str, scheme: str) -> None:
    """Called when the object at ``uri`` is absent: raise :func:`missing_container_error` when
    its bucket is absent too.

    One extra request, only on the "no object" path. A store that will not say (no permission
    on the bucket itself, say) leaves the answer "no object": only a definite "not found" for
    the bucket is reported.
    """
    container = container_and_key(uri)[0]
    try:
        fs.info(container)
    except FileNotFoundError:
        raise missing_container_error(uri, action, scheme) from None
    except Exception as exc:
        logger.debug("could not tell whether %s exists: %r", container, exc)


_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")


def unknown_option_error(exc: BaseException, scheme: str) -> ConfigurationError | None:
    """A :class:`ConfigurationError` naming the storage option a ``TypeError`` refused, if it was one.

    s3fs hands options it does not know to its botocore session, which refuses them only at the
    first request, as ``TypeError: ... unexpected keyword argument``.
    """
    match = _UNEXPECTED_KEYWORD.search(str(exc)) if isinstance(exc, TypeError) else None
    if match is None:
        return None
    try:
        accepted = accepted_options(scheme)
    except (ImportError, KeyError, ValueError, TypeError) as error:  # only the hint is lost
        logger.debug("could not list the storage options of %s://: %r", scheme, error)
        accepted = []
    return unknown_option(match.group(1), accepted, f"{scheme}:// storage")


def to_checkpoint_error(exc: BaseException, uri: str, action: str, scheme: str) -> BaseException:
    """The typed error for a backend failure while ``action`` ``uri``; unknown errors pass through."""
    if isinstance(exc, CheckpointError):
        return exc
    if _interpreter_shutting_down(exc):
        return CheckpointStorageError(
            f"cannot finish {action} {uri}: the interpreter is shutting down, and the store's client "
            "can start no more work; wait for saves to finish (wait_sync(), close(), or a `with` "
            "block) before the program ends"
        )
    kind = classify(exc)
    if kind == "permission":
        hint = CREDENTIAL_HINTS.get(scheme, "check the credentials in storage_options")
        return CheckpointPermissionError(
            f"access refused {action} {uri}: {type(exc).__name__}: {exc}; {hint}"
        )
    if kind == "transient":
        return CheckpointUnavailableError(f"storage unavailable {action} {uri}: {type(exc).__name__}: {exc}")
    # An upload cannot miss its object, only the bucket it goes into.
    if kind == "absent" and (action == "saving" or _names_missing_container(exc)):
        return missing_container_error(uri, action, scheme)
    if kind == "absent":
        return FileNotFoundError(f"{uri} not found ({type(exc).__name__}: {exc})")
    if isinstance(exc, OSError):
        return os_error_to_checkpoint_error(exc, uri, action)
    unknown_option = unknown_option_error(exc, scheme)
    if unknown_option is not None:
        return unknown_option
    if isinstance(exc, ValueError | TypeError | KeyError):
        return exc  # misuse (e.g. a bad storage option) keeps its own type and text
    return CheckpointStorageError(f"storage error {action} {uri}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def translated_backend_errors(uri: str, action: str, scheme: str) -> Iterator[None]:
    """Re-raise backend errors inside the block as typed errors naming ``uri``."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        translated = to_checkpoint_error(exc, uri, action, scheme)
        if translated is exc:
            raise
        raise translated from exc
