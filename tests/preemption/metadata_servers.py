"""A loopback metadata service speaking the AWS (IMDSv2), GCE and Azure preemption protocols.

Each protocol is served as its cloud documents it, checks included (see the docstring of
``flyte_checkpoint.preemption.cloud``): AWS hands out session tokens and answers ``401`` to a
missing, unknown or expired one; GCE answers ``403`` without ``Metadata-Flavor: Google`` and holds
``wait_for_change`` requests until the value leaves ``last_etag``; Azure answers ``400`` without
``Metadata: true``. A server speaks only the clouds it is started for: a path of another cloud
gets a bare ``404``, as that cloud's real service would give.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
GCE_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS_PATH = "/metadata/scheduledevents"
AZURE_NAME_PATH = "/metadata/instance/compute/name"


@dataclass(frozen=True)
class Served:
    """One request the server answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int


@dataclass
class MetadataState:
    """What the clouds announce now; change it while a watcher runs (under :attr:`changed`)."""

    aws_action: dict[str, str] | None = None
    gce_preempted: bool = False
    azure_events: list[dict[str, Any]] = field(default_factory=list)
    azure_incarnation: int = 1
    vm_name: str = "trainer_3"
    tokens: dict[str, float] = field(default_factory=dict)
    """AWS session token -> ``time.monotonic()`` at which it expires."""
    served: list[Served] = field(default_factory=list)
    closing: bool = False
    changed: threading.Condition = field(default_factory=threading.Condition)

    def announce_aws(self, action: str, seconds_ahead: float) -> datetime:
        """Put a Spot ``instance-action`` for ``seconds_ahead`` from now; returns its time."""
        moment = (datetime.now(timezone.utc) + timedelta(seconds=seconds_ahead)).replace(microsecond=0)
        with self.changed:
            self.aws_action = {"action": action, "time": moment.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return moment

    def preempt_gce(self) -> None:
        with self.changed:
            self.gce_preempted = True
            self.changed.notify_all()

    def schedule_azure(
        self,
        event_type: str,
        seconds_ahead: float,
        *,
        resources: list[str] | None = None,
        event_id: str = "E1",
    ) -> datetime:
        """Add a Scheduled Event ``NotBefore`` ``seconds_ahead`` from now; returns that time."""
        moment = (datetime.now(timezone.utc) + timedelta(seconds=seconds_ahead)).replace(microsecond=0)
        event = {
            "EventId": event_id,
            "EventType": event_type,
            "ResourceType": "VirtualMachine",
            "Resources": [self.vm_name] if resources is None else resources,
            "EventStatus": "Scheduled",
            "NotBefore": format_datetime(moment, usegmt=True),
            "Description": "",
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }
        with self.changed:
            self.azure_events.append(event)
            self.azure_incarnation += 1
        return moment

    def expire_tokens(self) -> None:
        with self.changed:
            for token in self.tokens:
                self.tokens[token] = 0.0

    def answered(self, path: str, status: int | None = None) -> list[Served]:
        with self.changed:
            return [each for each in self.served if each.path == path and status in (None, each.status)]


class _Handler(BaseHTTPRequestHandler):
    server: _MetadataServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer("GET")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def _answer(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        clouds, state = self.server.clouds, self.server.state
        route = {
            ("PUT", AWS_TOKEN_PATH): ("aws", self._aws_token),
            ("GET", AWS_ACTION_PATH): ("aws", self._aws_action),
            ("GET", GCE_PREEMPTED_PATH): ("gce", self._gce_preempted),
            ("GET", AZURE_EVENTS_PATH): ("azure", self._azure_events),
            ("GET", AZURE_NAME_PATH): ("azure", self._azure_name),
        }.get((method, parts.path))
        headers: dict[str, str]
        if route is None or route[0] not in clouds:
            status, headers, body = 404, {}, b""
        else:
            status, headers, body = route[1](query)
        with state.changed:
            state.served.append(Served(method, parts.path, query, dict(self.headers.items()), status))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    # -- AWS IMDSv2 ----------------------------------------------------------------------------

    def _aws_token(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return 400, {}, b""
        state = self.server.state
        with state.changed:
            token = f"token-{len(state.tokens) + 1}"
            state.tokens[token] = time.monotonic() + int(ttl)
        return 200, {"Content-Type": "text/plain"}, token.encode()

    def _aws_action(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        state = self.server.state
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        with state.changed:
            if state.tokens.get(token, 0.0) <= time.monotonic():  # missing, unknown or expired
                return 401, {}, b""
            action = state.aws_action
        if action is None:
            return 404, {"Content-Type": "text/html"}, b"<html>404 - Not Found</html>"
        return 200, {"Content-Type": "text/plain"}, json.dumps(action).encode()

    # -- GCE -----------------------------------------------------------------------------------

    def _gce_preempted(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        flavor = {"Metadata-Flavor": "Google"}
        if self.headers.get("Metadata-Flavor") != "Google":
            return 403, {**flavor, "Content-Type": "text/html"}, b"Missing Metadata-Flavor:Google header."
        state = self.server.state

        def value() -> str:
            return "TRUE" if state.gce_preempted else "FALSE"

        def etag() -> str:
            return hashlib.sha1(value().encode()).hexdigest()[:16]

        with state.changed:
            if query.get("wait_for_change") == ["true"]:
                last = query.get("last_etag", [""])[0]
                hold = float(query.get("timeout_sec", ["30"])[0])
                state.changed.wait_for(lambda: etag() != last or state.closing, timeout=hold)
            body, tag = value(), etag()
        return 200, {**flavor, "ETag": tag, "Content-Type": "application/text"}, body.encode()

    # -- Azure ---------------------------------------------------------------------------------

    def _azure_checks(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes] | None:
        if self.headers.get("Metadata") != "true":
            return _azure_bad_request("Required metadata header not specified")
        if not query.get("api-version"):
            return _azure_bad_request("api-version was not specified in the request")
        return None

    def _azure_events(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        refused = self._azure_checks(query)
        if refused is not None:
            return refused
        state = self.server.state
        with state.changed:
            document = {"DocumentIncarnation": state.azure_incarnation, "Events": list(state.azure_events)}
        return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()

    def _azure_name(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        refused = self._azure_checks(query)
        if refused is not None:
            return refused
        if query.get("format") != ["text"]:  # a leaf needs format=text
            return _azure_bad_request("format=json is not supported for leaf nodes")
        return 200, {"Content-Type": "text/plain"}, self.server.state.vm_name.encode()


def _azure_bad_request(why: str) -> tuple[int, dict[str, str], bytes]:
    return 400, {"Content-Type": "application/json"}, json.dumps({"error": f"Bad request. {why}"}).encode()


class _MetadataServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, clouds: frozenset[str], state: MetadataState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.clouds = clouds
        self.state = state


@dataclass(frozen=True)
class MetadataServer:
    url: str
    state: MetadataState


@contextmanager
def metadata_server(*clouds: str) -> Iterator[MetadataServer]:
    """Serve the clouds named (``"aws"``, ``"gce"``, ``"azure"``) on a free 127.0.0.1 port."""
    state = MetadataState()
    server = _MetadataServer(frozenset(clouds), state)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield MetadataServer(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        with state.changed:  # release held long-polls
            state.closing = True
            state.changed.notify_all()
        server.shutdown()
        server.server_close()
        thread.join(5)
