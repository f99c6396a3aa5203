"""Cloud preemption notices: the warning a cloud gives before the SIGTERM, as a preemption notice.

Opt-in: :func:`watch_cloud_notices` (or ``FLYTE_CHECKPOINT_CLOUD_NOTICES=aws,gce,azure`` / ``auto``,
which :func:`~flyte_checkpoint.preemption.install_preemption_handler` honours) watches each chosen
cloud's metadata service in a daemon thread and records what it announces with
:func:`.notice.notify` (source ``"aws-spot"``, ``"gce-preempted"`` or ``"azure-scheduled-event"``),
the grace period being the time left until the announced time, else the cloud's documented
warning. Saves then know their deadline up to two minutes before the signal arrives.

A cloud whose service does not answer (the process is not on that cloud) is tried a few times,
named once in a DEBUG line and no longer watched. Requests go straight to the link-local address
(never through a proxy), with short timeouts, using only the standard library. Endpoints can be
pointed elsewhere (tests, emulators) with ``base_urls`` or ``FLYTE_CHECKPOINT_METADATA_ENDPOINT_AWS``
/ ``_GCE`` / ``_AZURE``.

What each cloud documents, as this module relies on it:

AWS (EC2 User Guide: "Spot Instance interruption notices", "Use IMDSv2", "Retrieve instance
metadata"):

* the notice comes two minutes before EC2 stops or terminates the instance; check every 5 s;
* IMDSv2: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 s to 6 h)
  answers a token; each ``GET`` carries it in ``X-aws-ec2-metadata-token``; a missing, invalid or
  expired token gets ``401 - Unauthorized`` ("generate a new token"), an invalid ``PUT`` ``400``,
  a service turned off ``403``; in a container the token's answer needs a hop limit of 2;
* ``GET /latest/meta-data/spot/instance-action`` is ``404`` until a notice, then
  ``{"action": "terminate"|"stop"|"hibernate", "time": "2017-09-18T08:22:00Z"}`` (UTC, approximate);
* hibernation gets the notice without the two minutes: it begins at once and keeps memory, so the
  process resumes with the instance; it is not turned into a notice here.

GCE (Compute Engine metadata server, Google's ``metadata_watcher`` and maintenance-event sample,
``Scheduling.skipGuestOsShutdown``):

* ``GET /computeMetadata/v1/instance/preempted`` on ``metadata.google.internal`` or
  ``169.254.169.254`` with ``Metadata-Flavor: Google`` (``403`` without it); answers carry
  ``Metadata-Flavor: Google`` (how a client knows it reached GCE) and an ``ETag``;
* the body is ``FALSE``, then ``TRUE`` once the preemption starts;
* ``?wait_for_change=true&last_etag=<ETag>&timeout_sec=<n>`` holds the request until the value
  differs from that ETag (a long-poll); ``503`` during maintenance is retried;
* Spot and preemptible VMs get 30 s between ACPI G2 Soft Off and G3 Mechanical Off.

Azure (Instance Metadata Service; "Scheduled Events for Linux VMs"):

* ``GET /metadata/scheduledevents?api-version=2020-07-01`` on ``169.254.169.254`` with
  ``Metadata: true`` ("Bad Request" without it); proxies must be bypassed;
* ``{"DocumentIncarnation": n, "Events": [{"EventId", "EventType": "Preempt"|"Reboot"|"Redeploy"|
  "Freeze"|"Terminate", "ResourceType": "VirtualMachine", "Resources": [names], "EventStatus":
  "Scheduled"|"Started", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}``, ``NotBefore`` blank
  once started;
* ``Preempt``: the Spot VM is being evicted, at least 30 s ahead (best effort); events of every VM
  in an availability set or scale-set placement group reach all of them, ``Resources`` names the
  ones affected (this VM: ``/metadata/instance/compute/name?api-version=2021-02-01&format=text``);
* the first request enables the service and may take up to two minutes to answer; poll once a
  second (5 requests per second per VM at most).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from email.message import Message
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

from flyte_checkpoint.errors import ConfigurationError
from flyte_checkpoint.preemption import notice

logger = logging.getLogger("flyte_checkpoint")

PROVIDERS: tuple[str, ...] = ("aws", "gce", "azure")
CLOUD_NOTICES_ENV = "FLYTE_CHECKPOINT_CLOUD_NOTICES"
ENDPOINT_ENVS: Mapping[str, str] = {
    name: f"FLYTE_CHECKPOINT_METADATA_ENDPOINT_{name.upper()}" for name in PROVIDERS
}
DEFAULT_ENDPOINTS: Mapping[str, str] = {
    "aws": "http://169.254.169.254",
    # GCE's documented IP rather than metadata.google.internal: a name lookup off GCE is not
    # bounded by a socket timeout.
    "gce": "http://169.254.169.254",
    "azure": "http://169.254.169.254",
}

_CONNECT_SECONDS = 1.0
_READ_SECONDS = 2.0
_TRIES = 3
"""Consecutive failures after which a cloud that never answered is no longer watched."""
_MIN_GRACE_SECONDS = 1.0
"""An announced time already past (a late poll, clock skew) still leaves a moment to report."""
_MAX_BODY = 64 * 1024
_OFF_VALUES = ("", "off", "none", "0", "false")


# -- HTTP to a metadata service ---------------------------------------------------------------


class _Unanswered(Exception):
    """The service did not answer as the cloud documents it (why, in the message)."""


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: Message
    body: bytes

    def header(self, name: str) -> str:
        return self.headers.get(name) or ""

    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()


class _Endpoint:
    """One metadata service: plain HTTP straight to it (no proxy), a short connect timeout, and
    a request in flight that :meth:`abort` ends from another thread (a long-poll included)."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.url = base_url
        self._host = parts.hostname or ""
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._aborted = False

    def request(self, method: str, path: str, headers: Mapping[str, str], *, read_timeout: float) -> _Answer:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=_CONNECT_SECONDS)
        try:
            connection.connect()
            with self._lock:
                if self._aborted:
                    raise _Unanswered("the watcher is stopping")
                self._socket = connection.sock
            connection.sock.settimeout(read_timeout)
            connection.request(method, self._prefix + path, headers=dict(headers))
            response = connection.getresponse()
            return _Answer(response.status, response.headers, response.read(_MAX_BODY))
        except (OSError, http.client.HTTPException) as error:
            raise _Unanswered(f"{type(error).__name__}: {error}".rstrip(": ")) from None
        finally:
            with self._lock:
                self._socket = None
            connection.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._socket is not None:
                with contextlib.suppress(OSError):
                    self._socket.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it


# -- what each cloud announces ----------------------------------------------------------------


@dataclass(frozen=True)
class _Announced:
    """A notice a cloud gave: what identifies it, the seconds left, and how to describe it."""

    key: str
    grace_seconds: float
    detail: str


def _seconds_until(moment: datetime) -> float:
    return max(_MIN_GRACE_SECONDS, (moment - datetime.now(timezone.utc)).total_seconds())


class _Provider:
    name = ""
    source = ""
    poll_seconds = 1.0
    """The polling interval the cloud recommends."""
    hint = ""
    """Said when the service never answers, after the reason."""

    def check(self, endpoint: _Endpoint) -> _Announced | None:
        """The notice announced now, ``None`` without one; :class:`_Unanswered` when not answered."""
        raise NotImplementedError

    def pause(self, poll_seconds: float) -> float:
        """Seconds to wait before the next :meth:`check`."""
        return poll_seconds


class _AwsSpot(_Provider):
    name = "aws"
    source = "aws-spot"
    poll_seconds = 5.0
    hint = "not on EC2? in a container, IMDSv2 needs a hop limit of 2"
    warning_seconds = 120.0
    token_ttl = 21600

    def __init__(self) -> None:
        self._token: str | None = None
        self._token_until = 0.0
        self._told_hibernation = False

    def check(self, endpoint: _Endpoint) -> _Announced | None:
        answer = self._instance_action(endpoint)
        if answer.status == 401:  # the token expired or is not known: "generate a new token"
            self._token = None
            answer = self._instance_action(endpoint)
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise _Unanswered(f"spot/instance-action answered HTTP {answer.status}")
        return self._announced(answer.text())

    def _instance_action(self, endpoint: _Endpoint) -> _Answer:
        headers = {"X-aws-ec2-metadata-token": self._session_token(endpoint)}
        return endpoint.request(
            "GET", "/latest/meta-data/spot/instance-action", headers, read_timeout=_READ_SECONDS
        )

    def _session_token(self, endpoint: _Endpoint) -> str:
        if self._token is None or time.monotonic() >= self._token_until:
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)}
            answer = endpoint.request("PUT", "/latest/api/token", headers, read_timeout=_READ_SECONDS)
            if answer.status != 200 or not answer.text():
                raise _Unanswered(f"the IMDSv2 token request answered HTTP {answer.status}")
            self._token = answer.text()
            self._token_until = time.monotonic() + self.token_ttl * 0.9
        return self._token

    def _announced(self, body: str) -> _Announced | None:
        # A 200 means EC2 is preparing to stop or terminate the instance: an unreadable body is
        # still a notice, with the documented two minutes.
        try:
            document: Any = json.loads(body)
        except ValueError:
            document = None
        fields: dict[str, Any] = document if isinstance(document, dict) else {}
        action, when = str(fields.get("action", "")), str(fields.get("time", ""))
        if action == "hibernate":
            if not self._told_hibernation:
                self._told_hibernation = True
                logger.info("AWS announces hibernation at %s: the process resumes with the instance", when)
            return None
        try:
            moment = datetime.strptime(when, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
            grace = _seconds_until(moment)
        except ValueError:
            grace = self.warning_seconds
        detail = f"{action or 'interruption'} at {when or 'an unnamed time'}"
        return _Announced(f"{action} {when}", grace, detail)


class _GcePreempted(_Provider):
    name = "gce"
    source = "gce-preempted"
    hint = "not on Compute Engine?"
    warning_seconds = 30.0
    long_poll_seconds = 60
    path = "/computeMetadata/v1/instance/preempted"

    def __init__(self) -> None:
        self._etag: str | None = None
        self._at_once = False

    def check(self, endpoint: _Endpoint) -> _Announced | None:
        path, read_timeout = self.path, _READ_SECONDS
        if self._etag is not None:
            wait = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": self.long_poll_seconds}
            path += "?" + urllib.parse.urlencode(wait)
            read_timeout += self.long_poll_seconds * 1.1  # as Google's own watcher allows
        started = time.monotonic()
        answer = endpoint.request("GET", path, {"Metadata-Flavor": "Google"}, read_timeout=read_timeout)
        if answer.header("Metadata-Flavor") != "Google":
            raise _Unanswered(f"HTTP {answer.status} without Metadata-Flavor: Google (not GCE's service)")
        if answer.status != 200:
            raise _Unanswered(f"instance/preempted answered HTTP {answer.status}")
        etag = answer.header("ETag") or None
        # Ask again at once after a change or a long-poll that was held; a server that answers
        # long-polls at once with nothing new is polled at the interval instead.
        self._at_once = etag is not None and (etag != self._etag or time.monotonic() - started >= 1.0)
        self._etag = etag
        if answer.text().upper() != "TRUE":
            return None
        return _Announced("preempted", self.warning_seconds, "the instance is being preempted")

    def pause(self, poll_seconds: float) -> float:
        return 0.0 if self._at_once else poll_seconds


class _AzureScheduledEvents(_Provider):
    name = "azure"
    source = "azure-scheduled-event"
    hint = "not on Azure?"
    warning_seconds = 30.0
    first_read_seconds = 125.0
    """The first request enables Scheduled Events and may take up to two minutes to answer."""
    path = "/metadata/scheduledevents?api-version=2020-07-01"
    name_path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"

    def __init__(self) -> None:
        self._answered = False
        self._vm_name: str | None = None

    def check(self, endpoint: _Endpoint) -> _Announced | None:
        read_timeout = _READ_SECONDS if self._answered else self.first_read_seconds
        answer = endpoint.request("GET", self.path, {"Metadata": "true"}, read_timeout=read_timeout)
        if answer.status != 200:
            raise _Unanswered(f"scheduledevents answered HTTP {answer.status}")
        try:
            document: Any = json.loads(answer.body)
            events = [each for each in document["Events"] if isinstance(each, dict)]
        except (ValueError, TypeError, KeyError):
            raise _Unanswered("scheduledevents answered something other than its documented JSON") from None
        self._answered = True
        evictions = [each for each in events if each.get("EventType") == "Preempt"]
        mine = [each for each in evictions if self._concerns_this_vm(endpoint, each)]
        if not mine:
            return None
        soonest = min(mine, key=self._grace)
        not_before = str(soonest.get("NotBefore") or "")
        detail = f"Spot eviction not before {not_before}" if not_before else "Spot eviction started"
        return _Announced(f"{soonest.get('EventId')} {not_before}", self._grace(soonest), detail)

    def _grace(self, event: Mapping[str, Any]) -> float:
        try:
            return _seconds_until(parsedate_to_datetime(str(event.get("NotBefore") or "")))
        except (TypeError, ValueError):  # blank once started, or unreadable
            return self.warning_seconds

    def _concerns_this_vm(self, endpoint: _Endpoint, event: Mapping[str, Any]) -> bool:
        resources = event.get("Resources")
        name = self._name(endpoint)
        if not isinstance(resources, list) or not resources or name is None:
            return True  # cannot tell: a needless save costs less than a lost one
        return name.lower() in {str(each).lower() for each in resources}

    def _name(self, endpoint: _Endpoint) -> str | None:
        if self._vm_name is None:
            try:
                headers = {"Metadata": "true"}
                answer = endpoint.request("GET", self.name_path, headers, read_timeout=_READ_SECONDS)
            except _Unanswered:
                return None
            if answer.status == 200 and answer.text():
                self._vm_name = answer.text()
        return self._vm_name


_PROVIDER_TYPES: Mapping[str, type[_Provider]] = {
    "aws": _AwsSpot,
    "gce": _GcePreempted,
    "azure": _AzureScheduledEvents,
}


# -- the watcher ------------------------------------------------------------------------------


class _Watch:
    """One cloud being watched: its service, its thread, and the notice it last recorded."""

    def __init__(self, provider: _Provider, endpoint: _Endpoint) -> None:
        self.provider = provider
        self.endpoint = endpoint
        self.thread: threading.Thread | None = None
        self.key: str | None = None
        self.recorded: notice.PreemptionNotice | None = None


class CloudNoticeWatcher:
    """Watches clouds' metadata services for preemption notices, one daemon thread per cloud.

    Made by :func:`watch_cloud_notices`; :meth:`stop` (or leaving ``with``) ends the threads,
    a long-poll in flight included.
    """

    def __init__(
        self,
        providers: str | Iterable[str] = "auto",
        *,
        poll_seconds: float | None = None,
        base_urls: Mapping[str, str] | None = None,
    ) -> None:
        names = _provider_names(providers, "providers")
        number = isinstance(poll_seconds, int | float) and not isinstance(poll_seconds, bool)
        if poll_seconds is not None and not (number and 0 < poll_seconds < float("inf")):
            raise ConfigurationError(
                f"poll_seconds must be a finite number of seconds > 0 or None, got {poll_seconds!r}"
            )
        unknown = sorted(set(base_urls or {}) - set(PROVIDERS))
        if unknown:
            raise ConfigurationError(
                f"base_urls names {unknown[0]!r}; its keys are some of {', '.join(PROVIDERS)}"
            )
        self._poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._watches = [
            _Watch(_PROVIDER_TYPES[name](), _Endpoint(_endpoint_url(name, base_urls or {}))) for name in names
        ]

    @property
    def providers(self) -> tuple[str, ...]:
        """The clouds asked for."""
        return tuple(watch.provider.name for watch in self._watches)

    @property
    def watching(self) -> tuple[str, ...]:
        """The clouds still watched: those whose service answered or has not failed enough yet."""
        return tuple(watch.provider.name for watch in self._watches if _alive(watch.thread))

    def start(self) -> CloudNoticeWatcher:
        """Start a thread per cloud (once); returns ``self``."""
        for watch in self._watches:
            if watch.thread is None and not self._stop.is_set():
                name = f"flyte-checkpoint-{watch.provider.source}"
                watch.thread = threading.Thread(target=self._run, args=(watch,), name=name, daemon=True)
                watch.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End every thread, waiting up to ``timeout`` seconds for them (idempotent)."""
        self._stop.set()
        for watch in self._watches:
            watch.endpoint.abort()
        deadline = time.monotonic() + timeout
        for watch in self._watches:
            if watch.thread is not None and watch.thread is not threading.current_thread():
                watch.thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> CloudNoticeWatcher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self, watch: _Watch) -> None:
        provider, answered, failures, warned = watch.provider, False, 0, False
        poll = self._poll_seconds if self._poll_seconds is not None else provider.poll_seconds
        while not self._stop.is_set():
            try:
                announced = provider.check(watch.endpoint)
            except Exception as error:  # never let a watcher thread die of a surprise
                if self._stop.is_set():
                    return
                failures += 1
                reason = str(error) if isinstance(error, _Unanswered) else repr(error)
                if not answered and failures >= _TRIES:
                    logger.debug(
                        "%s metadata service at %s did not answer (%s); not watching it (%s)",
                        provider.name,
                        watch.endpoint.url,
                        reason,
                        provider.hint,
                    )
                    return
                if answered and not warned:
                    warned = True
                    logger.warning(
                        "%s metadata service at %s stopped answering (%s); still watching it",
                        provider.name,
                        watch.endpoint.url,
                        reason,
                    )
                self._stop.wait(poll)
                continue
            answered, failures = True, 0
            if announced is not None:
                self._record(watch, announced)
            self._stop.wait(provider.pause(poll))

    def _record(self, watch: _Watch, announced: _Announced) -> None:
        """Notify once per announcement, and again if the notice was cleared (a new attempt)."""
        still_recorded = watch.recorded is not None and notice.current_notice() is watch.recorded
        if announced.key == watch.key and still_recorded:
            return
        if self._stop.is_set():
            return
        if announced.key != watch.key:
            logger.warning(
                "preemption notice from %s: %s (in %.0f s)",
                watch.provider.source,
                announced.detail,
                announced.grace_seconds,
            )
        watch.key = announced.key
        watch.recorded = notice.notify(watch.provider.source, announced.grace_seconds)


def _alive(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.is_alive()


def watch_cloud_notices(
    providers: str | Iterable[str] = "auto",
    *,
    poll_seconds: float | None = None,
    base_urls: Mapping[str, str] | None = None,
) -> CloudNoticeWatcher:
    """Watch clouds' metadata services and turn a preemption notice into the process's notice.

    ``providers`` is ``"auto"`` (every cloud: those not answering are dropped after a few tries),
    a comma-separated string or names among ``"aws"``, ``"gce"``, ``"azure"``. ``poll_seconds``
    is the interval between checks (``None``: what each cloud recommends, 5 s for AWS, 1 s for
    Azure; GCE is long-polled). ``base_urls`` maps a cloud to its service's ``http://`` URL
    (default: ``FLYTE_CHECKPOINT_METADATA_ENDPOINT_<CLOUD>``, else the link-local address)::

        with watch_cloud_notices("aws"):
            train()

    Returns the started :class:`CloudNoticeWatcher`.
    """
    return CloudNoticeWatcher(providers, poll_seconds=poll_seconds, base_urls=base_urls).start()


def cloud_notices_from_env() -> CloudNoticeWatcher | None:
    """A watcher (not started) for the clouds named in ``FLYTE_CHECKPOINT_CLOUD_NOTICES``
    (``aws,gce,azure`` or ``auto``), ``None`` when unset, blank or ``off``."""
    raw = os.environ.get(CLOUD_NOTICES_ENV, "").strip()
    if raw.lower() in _OFF_VALUES:
        return None
    return CloudNoticeWatcher(_provider_names(raw, f"{CLOUD_NOTICES_ENV}={raw!r}"))


def _provider_names(providers: str | Iterable[str], where: str) -> tuple[str, ...]:
    wanted = providers.split(",") if isinstance(providers, str) else list(providers)
    names = [str(each).strip().lower() for each in wanted if str(each).strip()]
    if names == ["auto"]:
        return PROVIDERS
    unknown = [name for name in names if name not in PROVIDERS]
    if unknown or not names:
        named = f"names {unknown[0]!r}" if unknown else "names no cloud"
        raise ConfigurationError(
            f"{where} {named}; name some of {', '.join(PROVIDERS)} (comma-separated), or 'auto' for all"
        )
    return tuple(dict.fromkeys(names))


def _endpoint_url(name: str, base_urls: Mapping[str, str]) -> str:
    given = base_urls.get(name)
    from_env = os.environ.get(ENDPOINT_ENVS[name], "").strip()
    url = given or from_env or DEFAULT_ENDPOINTS[name]
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        where = f"base_urls[{name!r}]" if given else ENDPOINT_ENVS[name]
        raise ConfigurationError(
            f"{where}={url!r} is not the http:// URL of a metadata service; e.g. {DEFAULT_ENDPOINTS[name]!r}"
        )
    return url
