"""A fault-injecting HTTP/1.1 proxy for tests.

Storage emulators (moto, fake-gcs-server, Azurite) answer correctly every time; the code under
test must also survive the answers they never give: throttling, resets, truncated bodies and
stalls. :class:`FaultProxy` sits between a client and such an upstream on loopback, relays
traffic unchanged by default, and applies faults to chosen requests::

    with FaultProxy(upstream=("127.0.0.1", moto_port)) as proxy:
        proxy.add_fault(status(503, retry_after=1), times=2, method="PUT")
        proxy.add_fault(drop_mid_response(after_bytes=1024), path_contains="uploadId")
        run_client_against(proxy.url)
        puts = [r for r in proxy.requests if r.method == "PUT"]

The proxy understands just enough HTTP/1.1 to find request and response boundaries
(Content-Length, chunked, read-until-close) on keep-alive connections; bytes are otherwise
relayed verbatim, including the Host header, so emulators that build URLs from it keep
pointing at the proxy.

It runs on plain threads (one accept thread, one per client connection), so it works from
synchronous tests and from code whose asyncio loops live elsewhere. Every blocking call
waits at most ``_POLL`` seconds before checking the stop flag, which is what lets
:meth:`FaultProxy.stop` finish promptly and join every thread.
"""

from __future__ import annotations

import array
import http
import itertools
import logging
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar, Literal, TypeAlias

if sys.platform == "linux":
    import fcntl
    import termios

__all__ = [
    "DropBeforeResponse",
    "DropMidRequest",
    "DropMidResponse",
    "Fault",
    "FaultProxy",
    "RequestRecord",
    "Stall",
    "Status",
    "drop_before_response",
    "drop_mid_request",
    "drop_mid_response",
    "stall",
    "status",
]

_log = logging.getLogger(__name__)

# Upper bound on any single blocking socket call; it is the worst-case latency of stop().
_POLL = 0.05
_RECV_SIZE = 64 * 1024
_MAX_HEAD = 64 * 1024
_MAX_LINE = 8 * 1024
# How long an abortive close waits for already-sent bytes to leave the send queue, so that
# the RST does not destroy data the fault promised to deliver.
_FLUSH_LIMIT = 1.0
_MAX_STALL = 300.0
_JOIN_LIMIT = 5.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# The proxy frames these itself; letting a caller override them would desynchronise clients.
_RESERVED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """Answer with ``code`` without contacting the upstream.

    The request body is read and discarded first, so the connection stays usable and the
    client sees an ordinary, complete response (with a correct Content-Length).
    """

    code: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    retry_after: int | None = None
    name: ClassVar[str] = "status"

    def __post_init__(self) -> None:
        if not 200 <= self.code <= 599:
            raise ValueError(f"status code must be a final status (200-599), got {self.code}")
        if self.code in (204, 304) and self.body:
            raise ValueError(f"a {self.code} response cannot carry a body")
        if self.retry_after is not None and self.retry_after < 0:
            raise ValueError("retry_after must be >= 0")
        for key, value in self.headers:
            if key.lower() in _RESERVED_HEADERS:
                raise ValueError(f"header {key!r} is set by the proxy")
            if any(c in key + value for c in "\r\n"):
                raise ValueError(f"header {key!r} contains a line break")


@dataclass(frozen=True)
class DropBeforeResponse:
    """Forward the request, wait for the upstream's full response, then close the client
    connection without sending any of it.

    The upstream has therefore finished processing the request (an upload landed, a delete
    happened) while the client only sees a dead connection: the case retries must tolerate.
    ``reset=True`` closes with a TCP RST (``ConnectionResetError`` in the client),
    ``reset=False`` with a FIN (a "server disconnected" error).
    """

    reset: bool = True
    name: ClassVar[str] = "drop_before_response"


@dataclass(frozen=True)
class DropMidResponse:
    """Forward the request, relay the upstream's response head and the first ``after_bytes``
    bytes of its body (as framed on the wire), then close the client connection.

    ``reset=True`` closes with a TCP RST after the relayed bytes have left the proxy's send
    queue; ``reset=False`` closes with a FIN, which ``http.client`` reports as
    ``IncompleteRead``. If the body is shorter than ``after_bytes`` it is relayed whole and the
    connection is still closed.
    """

    after_bytes: int
    reset: bool = True
    pause: float = 0.0
    """Seconds to wait, once the relayed bytes have left, before closing: a client that has not
    read them when the RST lands loses them (aiohttp raises a stream's error before its data)."""
    name: ClassVar[str] = "drop_mid_response"

    def __post_init__(self) -> None:
        if self.after_bytes < 0:
            raise ValueError("after_bytes must be >= 0")


@dataclass(frozen=True)
class DropMidRequest:
    """Read ``after_bytes`` bytes of the request body (as framed on the wire), then reset the
    client connection.

    The upstream is never contacted, so it cannot observe even a partial request.
    """

    after_bytes: int
    name: ClassVar[str] = "drop_mid_request"

    def __post_init__(self) -> None:
        if self.after_bytes < 0:
            raise ValueError("after_bytes must be >= 0")


@dataclass(frozen=True)
class Stall:
    """Read the whole request, then send nothing for ``seconds``.

    With ``forward=False`` (default) the upstream is never contacted and the connection is
    closed when the stall ends. With ``forward=True`` the request is forwarded at once and the
    upstream's response is held back for ``seconds`` before being relayed: a slow server whose
    side effects already happened. :meth:`FaultProxy.stop` interrupts a stall immediately.
    """

    seconds: float
    forward: bool = False
    name: ClassVar[str] = "stall"

    def __post_init__(self) -> None:
        if not 0 <= self.seconds <= _MAX_STALL:
            raise ValueError(f"stall seconds must be within [0, {_MAX_STALL}]")


Fault: TypeAlias = Status | DropBeforeResponse | DropMidResponse | DropMidRequest | Stall


def status(
    code: int,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    *,
    retry_after: int | None = None,
) -> Status:
    """Answer with ``code`` (and optionally a ``Retry-After`` header) instead of forwarding."""
    return Status(code, body, tuple((headers or {}).items()), retry_after)


def drop_before_response(*, reset: bool = True) -> DropBeforeResponse:
    """Forward the request, then close the client connection without any response."""
    return DropBeforeResponse(reset)


def drop_mid_response(after_bytes: int, *, reset: bool = True, pause: float = 0.0) -> DropMidResponse:
    """Relay the response head and ``after_bytes`` body bytes, then (``pause`` seconds later)
    close abruptly."""
    return DropMidResponse(after_bytes, reset, pause)


def drop_mid_request(after_bytes: int) -> DropMidRequest:
    """Read ``after_bytes`` of the request body, then reset; the upstream sees nothing."""
    return DropMidRequest(after_bytes)


def stall(seconds: float, *, forward: bool = False) -> Stall:
    """Send nothing for ``seconds`` (optionally after forwarding the request upstream)."""
    return Stall(seconds, forward)


# --------------------------------------------------------------------------------------------
# Request log
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request that reached the proxy.

    ``path`` is the request target as sent (path and query). ``fault`` is the name of the fault
    applied (``"status"``, ``"drop_mid_response"`` ...) or ``None`` when passed through.
    ``status`` is the status code the client was sent, ``None`` if no response head reached it;
    ``upstream_status`` is what the upstream answered, ``None`` if it was not asked.
    ``request_body_bytes`` counts body bytes read from the client as framed on the wire.
    ``error`` describes an unplanned failure (client or upstream misbehaving), else ``None``.
    """

    method: str
    path: str
    fault: str | None
    status: int | None
    upstream_status: int | None
    request_body_bytes: int
    error: str | None


@dataclass
class _LiveRecord:
    """Mutable counterpart of :class:`RequestRecord`; only touched under the proxy lock."""

    method: str
    path: str
    fault: str | None
    status: int | None = None
    upstream_status: int | None = None
    request_body_bytes: int = 0
    error: str | None = None

    def freeze(self) -> RequestRecord:
        return RequestRecord(
            self.method,
            self.path,
            self.fault,
            self.status,
            self.upstream_status,
            self.request_body_bytes,
            self.error,
        )


@dataclass
class _Rule:
    fault: Fault
    remaining: int | None
    method: str | None
    path_contains: str | None

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        return self.path_contains is None or self.path_contains in target


# --------------------------------------------------------------------------------------------
# HTTP/1.1 framing
# --------------------------------------------------------------------------------------------


class _ProxyError(Exception):
    """A connection cannot continue; the message ends up in ``RequestRecord.error``."""


class _ProtocolError(_ProxyError):
    pass


class _Truncated(_ProxyError):
    pass


class _IdleTimeout(_ProxyError):
    pass


class _Stopped(Exception):
    """Raised inside connection threads once stop() was called, to unwind them."""


@dataclass(frozen=True)
class _Framing:
    kind: Literal["length", "chunked", "until_close"]
    length: int = 0

    @property
    def has_body(self) -> bool:
        return self.kind != "length" or self.length > 0


@dataclass(frozen=True)
class _Head:
    start_line: str
    raw_lines: tuple[bytes, ...]
    fields: tuple[tuple[str, str], ...]

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.fields if key == name]

    def tokens(self, name: str) -> list[str]:
        return [
            token.strip().lower()
            for value in self.values(name)
            for token in value.split(",")
            if token.strip()
        ]


@dataclass(frozen=True)
class _Request:
    head: _Head
    method: str
    target: str
    framing: _Framing
    keep_alive: bool
    expects_continue: bool

    def forward_bytes(self) -> bytes:
        # The proxy answers "100 Continue" itself, so the upstream must not be asked to.
        kept = [line for line in self.head.raw_lines if _field_name(line) != "expect"]
        return b"\r\n".join([self.head.start_line.encode("latin-1"), *kept]) + b"\r\n\r\n"


@dataclass(frozen=True)
class _Response:
    raw: bytes
    status: int
    framing: _Framing
    keep_alive: bool


def _field_name(line: bytes) -> str:
    return line.split(b":", 1)[0].strip().decode("latin-1").lower()


def _parse_head(raw: bytes) -> _Head:
    lines = [line.rstrip(b"\r") for line in raw.split(b"\n")]
    # RFC 9112 lets a peer send stray empty lines before the start line.
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise _ProtocolError("empty message head")
    fields: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise _ProtocolError(f"malformed header line {line[:80]!r}")
        fields.append((name.decode("latin-1").lower(), value.strip().decode("latin-1")))
    return _Head(lines[0].decode("latin-1"), tuple(lines[1:]), tuple(fields))


def _keep_alive(version: str, head: _Head) -> bool:
    tokens = head.tokens("connection")
    if "close" in tokens:
        return False
    if version == "HTTP/1.0":
        return "keep-alive" in tokens
    return True


def _message_framing(head: _Head) -> _Framing | None:
    """Framing declared by the headers, or None when neither length header is present."""
    codings = head.tokens("transfer-encoding")
    if codings:
        if codings[-1] != "chunked":
            raise _ProtocolError(f"unsupported transfer-encoding {codings}")
        return _Framing("chunked")
    lengths = {token for value in head.values("content-length") for token in value.split(",")}
    if not lengths:
        return None
    if len(lengths) != 1 or not next(iter(lengths)).strip().isdigit():
        raise _ProtocolError(f"invalid content-length {sorted(lengths)}")
    return _Framing("length", int(next(iter(lengths))))


def _parse_request(raw: bytes) -> _Request:
    head = _parse_head(raw)
    parts = head.start_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _ProtocolError(f"malformed request line {head.start_line[:80]!r}")
    method, target, version = parts
    framing = _message_framing(head) or _Framing("length", 0)
    return _Request(
        head=head,
        method=method,
        target=target,
        framing=framing,
        keep_alive=_keep_alive(version, head),
        expects_continue=(
            version == "HTTP/1.1" and "100-continue" in head.tokens("expect") and framing.has_body
        ),
    )


def _parse_response(raw: bytes, request_method: str) -> _Response:
    head = _parse_head(raw)
    parts = head.start_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise _ProtocolError(f"malformed status line {head.start_line[:80]!r}")
    code = int(parts[1])
    framing: _Framing
    if code == 101:
        # Protocol upgrades are out of scope; relaying until close keeps the bytes flowing.
        framing = _Framing("until_close")
    elif request_method == "HEAD" or 100 <= code < 200 or code in (204, 304):
        framing = _Framing("length", 0)
    else:
        framing = _message_framing(head) or _Framing("until_close")
    keep_alive = _keep_alive(parts[0], head) and framing.kind != "until_close"
    return _Response(raw, code, framing, keep_alive)


def _render_status(fault: Status, *, head_only: bool, close: bool) -> bytes:
    try:
        reason = http.HTTPStatus(fault.code).phrase
    except ValueError:
        reason = "Injected Fault"
    lines = [f"HTTP/1.1 {fault.code} {reason}"]
    bodiless = fault.code in (204, 304)
    if not bodiless:
        lines.append(f"Content-Length: {len(fault.body)}")
    if fault.retry_after is not None:
        lines.append(f"Retry-After: {fault.retry_after}")
    lines.extend(f"{key}: {value}" for key, value in fault.headers)
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only or bodiless else head + fault.body


class _Stream:
    """A socket with a read buffer; every blocking call re-checks the stop flag each _POLL."""

    def __init__(self, sock: socket.socket, stop: threading.Event, timeout: float) -> None:
        self.sock = sock
        self._stop = stop
        self._timeout = timeout
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def _fill(self) -> bool:
        deadline = time.monotonic() + self._timeout
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                data = self.sock.recv(_RECV_SIZE)
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise _IdleTimeout(f"no data for {self._timeout}s") from None
                continue
            if not data:
                return False
            self._buf += data
            return True

    def read_head(self) -> bytes | None:
        """Return one message head (through the blank line), or None on EOF before any byte."""
        start = 0
        while True:
            end = self._buf.find(b"\r\n\r\n", start)
            if end >= 0:
                head = bytes(self._buf[: end + 4])
                del self._buf[: end + 4]
                return head
            if len(self._buf) > _MAX_HEAD:
                raise _ProtocolError("header section too large")
            start = max(0, len(self._buf) - 3)
            if not self._fill():
                if self._buf.strip():
                    raise _Truncated("connection closed inside a message head")
                return None

    def read_line(self) -> bytes:
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            if len(self._buf) > _MAX_LINE:
                raise _ProtocolError("line too long")
            start = len(self._buf)
            if not self._fill():
                raise _Truncated("connection closed inside a chunked body")

    def read_some(self, limit: int) -> bytes:
        """Return up to ``limit`` bytes, or b"" at EOF."""
        if not self._buf and not self._fill():
            return b""
        piece = bytes(self._buf[:limit])
        del self._buf[:limit]
        return piece

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + self._timeout
        while view:
            if self._stop.is_set():
                raise _Stopped
            try:
                sent = self.sock.send(view)
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise _IdleTimeout(f"peer did not read for {self._timeout}s") from None
                continue
            view = view[sent:]
            deadline = time.monotonic() + self._timeout


def _iter_body(stream: _Stream, framing: _Framing) -> Iterator[bytes]:
    """Yield a message body exactly as framed on the wire (chunk framing included)."""
    if framing.kind == "length":
        remaining = framing.length
        while remaining > 0:
            piece = stream.read_some(min(remaining, _RECV_SIZE))
            if not piece:
                raise _Truncated(f"connection closed with {remaining} body bytes outstanding")
            remaining -= len(piece)
            yield piece
    elif framing.kind == "chunked":
        while True:
            line = stream.read_line()
            yield line
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _ProtocolError(f"bad chunk size line {line[:80]!r}") from None
            if size == 0:
                break
            remaining = size + 2  # chunk data plus its CRLF
            while remaining > 0:
                piece = stream.read_some(min(remaining, _RECV_SIZE))
                if not piece:
                    raise _Truncated("connection closed inside a chunk")
                remaining -= len(piece)
                yield piece
        while True:  # trailer section, ended by an empty line
            line = stream.read_line()
            yield line
            if line in (b"\r\n", b"\n"):
                return
    else:
        while piece := stream.read_some(_RECV_SIZE):
            yield piece


if sys.platform == "linux":

    def _unsent_bytes(sock: socket.socket) -> int | None:
        buf = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf, True)
        except OSError:
            return None
        return buf[0]

else:

    def _unsent_bytes(sock: socket.socket) -> int | None:
        return None


# --------------------------------------------------------------------------------------------
# The proxy
# --------------------------------------------------------------------------------------------


class _UpstreamLink:
    """The upstream connection paired with one client connection, opened lazily."""

    def __init__(self, proxy: FaultProxy) -> None:
        self._proxy = proxy
        self.stream: _Stream | None = None

    def open(self) -> _Stream:
        if self.stream is not None and not self._reusable(self.stream):
            self.close()
        if self.stream is None:
            self.stream = self._proxy._connect_upstream()
        return self.stream

    @staticmethod
    def _reusable(stream: _Stream) -> bool:
        # An idle upstream that already sent EOF (or stray bytes) would fail the next request
        # after its body has been consumed from the client, when it can no longer be replayed.
        if stream.buffered:
            return False
        sock = stream.sock
        try:
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)
            finally:
                sock.settimeout(_POLL)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def close(self) -> None:
        if self.stream is not None:
            self._proxy._close(self.stream.sock)
            self.stream = None


class FaultProxy:
    """HTTP/1.1 proxy on ``127.0.0.1`` that relays to ``upstream`` and injects faults.

    Faults are queued with :meth:`add_fault`; each request takes the first queued rule that
    matches it, and requests that match none pass through unchanged. Every request is logged in
    :attr:`requests`. ``timeout`` bounds how long any read or write may go without progress.
    Use as a context manager, or call :meth:`start` and :meth:`stop`; a proxy starts once.
    """

    def __init__(self, upstream: tuple[str, int], *, timeout: float = 30.0) -> None:
        self._upstream = upstream
        self._timeout = timeout
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state: Literal["new", "running", "stopped"] = "new"
        self._rules: list[_Rule] = []
        self._records: list[_LiveRecord] = []
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._port: int | None = None
        self._connection_ids = itertools.count(1)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Bind a free port on 127.0.0.1 and start accepting connections."""
        with self._lock:
            if self._state != "new":
                raise RuntimeError("a FaultProxy can only be started once")
            listener = socket.create_server(("127.0.0.1", 0), backlog=128)
            listener.settimeout(_POLL)
            self._listener = listener
            self._port = int(listener.getsockname()[1])
            self._accept_thread = threading.Thread(
                target=self._accept_loop,
                name=f"fault-proxy-{self._port}-accept",
                daemon=True,
            )
            self._state = "running"
            self._accept_thread.start()

    def stop(self) -> None:
        """Close the listener and every open connection and join all threads; idempotent.

        Raises RuntimeError if a thread fails to finish, which would be a proxy bug.
        """
        with self._lock:
            was_running = self._state == "running"
            self._state = "stopped"
        if not was_running:
            return
        self._stop.set()
        deadline = time.monotonic() + _JOIN_LIMIT
        if self._accept_thread is not None:
            self._accept_thread.join(_JOIN_LIMIT)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            # shutdown() wakes a peer or a blocked recv at once instead of after the next poll.
            for sock in self._sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in [self._accept_thread, *threads] if t is not None and t.is_alive()]
        if alive:
            raise RuntimeError(f"fault proxy threads did not stop: {alive}")

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The listening port (only once started)."""
        if self._port is None:
            raise RuntimeError("the proxy has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, to use as a client's endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    # -- faults and log -------------------------------------------------------------------

    def add_fault(
        self,
        fault: Fault,
        *,
        times: int | None = 1,
        method: str | None = None,
        path_contains: str | None = None,
    ) -> None:
        """Apply ``fault`` to the next ``times`` matching requests (``None``: until cleared).

        A request matches when its method equals ``method`` and its target (path and query)
        contains ``path_contains``; omitted criteria match everything. Rules are consulted in
        the order they were added and a request consumes at most one, so successive calls
        build a queue: ``add_fault(status(503), times=2); add_fault(drop_before_response())``
        gives two 503s, one dropped connection, then pass-through.
        """
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None")
        rule = _Rule(fault, times, method.upper() if method else None, path_contains)
        with self._lock:
            self._rules.append(rule)

    def clear_faults(self) -> None:
        """Forget all pending faults; later requests pass through."""
        with self._lock:
            self._rules.clear()

    @property
    def requests(self) -> list[RequestRecord]:
        """Snapshot of every request seen so far, in arrival order.

        A record is updated before the client can observe the outcome, so after a client call
        returns (or fails) the corresponding record is already final.
        """
        with self._lock:
            return [record.freeze() for record in self._records]

    def clear_requests(self) -> None:
        """Empty the request log (e.g. after test setup traffic)."""
        with self._lock:
            self._records.clear()

    # -- connection handling --------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                _log.exception("fault proxy accept failed")
                self._stop.wait(_POLL)
                continue
            self._spawn(sock)

    def _spawn(self, sock: socket.socket) -> None:
        sock.settimeout(_POLL)
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._stop.is_set():
                sock.close()
                return
            self._sockets.add(sock)
            thread = threading.Thread(
                target=self._serve,
                args=(sock,),
                name=f"fault-proxy-{self._port}-conn-{next(self._connection_ids)}",
                daemon=True,
            )
            self._threads.add(thread)
            thread.start()

    def _connect_upstream(self) -> _Stream:
        deadline = time.monotonic() + self._timeout
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                # Short attempts keep stop() prompt; on loopback a connect that does not finish
                # in this time is a full backlog, and retrying is the right response.
                sock = socket.create_connection(self._upstream, timeout=0.25)
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        sock.settimeout(_POLL)
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._stop.is_set():
                sock.close()
                raise _Stopped
            self._sockets.add(sock)
        return _Stream(sock, self._stop, self._timeout)

    def _close(self, sock: socket.socket) -> None:
        # Under the lock so stop() never calls shutdown() on a descriptor number that a
        # concurrent close() has already released for reuse.
        with self._lock:
            self._sockets.discard(sock)
            sock.close()

    def _abort(self, sock: socket.socket, *, reset: bool) -> None:
        if reset:
            # SO_LINGER 0 discards whatever is still queued; wait until the bytes the fault
            # promised have left, so the client receives exactly those before the RST.
            deadline = time.monotonic() + _FLUSH_LIMIT
            while time.monotonic() < deadline and not self._stop.is_set():
                if not _unsent_bytes(sock):
                    break
                self._stop.wait(0.002)
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        self._close(sock)

    def _serve(self, sock: socket.socket) -> None:
        client = _Stream(sock, self._stop, self._timeout)
        upstream = _UpstreamLink(self)
        try:
            while not self._stop.is_set() and self._serve_one(client, upstream):
                pass
        except _Stopped:
            pass
        except Exception:
            _log.exception("fault proxy connection handler crashed")
        finally:
            upstream.close()
            self._close(sock)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _serve_one(self, client: _Stream, upstream: _UpstreamLink) -> bool:
        """Handle one request; return whether the client connection stays open."""
        try:
            raw = client.read_head()
            if raw is None:
                return False
            request = _parse_request(raw)
        except _ProtocolError as exc:
            with suppress(OSError, _ProxyError):
                client.send(_render_status(Status(400, str(exc).encode()), head_only=False, close=True))
            return False
        except (_ProxyError, OSError):
            return False  # idle keep-alive connection timed out or was closed by the client
        with self._lock:
            fault = self._take_fault(request)
            record = _LiveRecord(request.method, request.target, fault.name if fault else None)
            self._records.append(record)
        try:
            return self._handle(request, fault, client, upstream, record)
        except _Stopped:
            self._note_error(record, "proxy stopped")
            raise
        except (_ProxyError, OSError) as exc:
            self._note_error(record, f"{type(exc).__name__}: {exc}")
            return False

    def _take_fault(self, request: _Request) -> Fault | None:
        for rule in self._rules:
            if rule.matches(request.method, request.target):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._rules.remove(rule)
                return rule.fault
        return None

    def _note_error(self, record: _LiveRecord, message: str) -> None:
        with self._lock:
            if record.error is None:
                record.error = message

    def _count_body(self, record: _LiveRecord, n: int) -> None:
        with self._lock:
            record.request_body_bytes += n

    def _read_body(self, request: _Request, client: _Stream, record: _LiveRecord) -> None:
        if request.expects_continue:
            client.send(_CONTINUE)
        for piece in _iter_body(client, request.framing):
            self._count_body(record, len(piece))

    def _handle(
        self,
        request: _Request,
        fault: Fault | None,
        client: _Stream,
        upstream: _UpstreamLink,
        record: _LiveRecord,
    ) -> bool:
        if isinstance(fault, Status):
            self._read_body(request, client, record)
            with self._lock:
                record.status = fault.code
            rendered = _render_status(fault, head_only=request.method == "HEAD", close=not request.keep_alive)
            client.send(rendered)
            return request.keep_alive
        if isinstance(fault, DropMidRequest):
            self._drop_mid_request(fault, request, client, record)
            return False
        if isinstance(fault, Stall) and not fault.forward:
            self._read_body(request, client, record)
            self._stop.wait(fault.seconds)
            return False
        return self._forward(request, fault, client, upstream, record)

    def _drop_mid_request(
        self, fault: DropMidRequest, request: _Request, client: _Stream, record: _LiveRecord
    ) -> None:
        if request.expects_continue:
            client.send(_CONTINUE)
        taken = 0
        if fault.after_bytes > 0:
            for piece in _iter_body(client, request.framing):
                take = min(len(piece), fault.after_bytes - taken)
                taken += take
                self._count_body(record, take)
                if taken >= fault.after_bytes:
                    break
        self._abort(client.sock, reset=True)

    def _bad_gateway(self, client: _Stream, record: _LiveRecord, code: int, message: str) -> bool:
        with self._lock:
            record.status = code
            record.error = message
        client.send(_render_status(Status(code, message.encode()), head_only=False, close=True))
        return False

    def _forward(
        self,
        request: _Request,
        fault: DropBeforeResponse | DropMidResponse | Stall | None,
        client: _Stream,
        upstream: _UpstreamLink,
        record: _LiveRecord,
    ) -> bool:
        if request.expects_continue:
            client.send(_CONTINUE)
        try:
            up = upstream.open()
        except OSError as exc:
            for piece in _iter_body(client, request.framing):
                self._count_body(record, len(piece))
            return self._bad_gateway(client, record, 502, f"upstream unreachable: {exc}")

        upstream_intact = True
        try:
            up.send(request.forward_bytes())
        except OSError:
            upstream_intact = False
        for piece in _iter_body(client, request.framing):
            self._count_body(record, len(piece))
            if upstream_intact:
                try:
                    up.send(piece)
                except OSError:
                    # The upstream may have answered early and closed; keep draining the
                    # client so its request completes, then relay whatever answer exists.
                    upstream_intact = False
        if isinstance(fault, Stall):
            self._stop.wait(fault.seconds)

        try:
            response = self._read_response(up, request.method)
        except (_ProxyError, OSError) as exc:
            upstream.close()
            if isinstance(fault, DropBeforeResponse):
                self._abort(client.sock, reset=fault.reset)
                return False
            code = 504 if isinstance(exc, _IdleTimeout) else 502
            return self._bad_gateway(client, record, code, f"upstream failed: {exc}")
        with self._lock:
            record.upstream_status = response.status

        if isinstance(fault, DropBeforeResponse):
            # Let the upstream finish so its side effects are complete when the client fails.
            for _ in _iter_body(up, response.framing):
                pass
            upstream.close()
            self._abort(client.sock, reset=fault.reset)
            return False

        with self._lock:
            record.status = response.status
        client.send(response.raw)
        limit = fault.after_bytes if isinstance(fault, DropMidResponse) else None
        sent = 0
        for piece in _iter_body(up, response.framing):
            if limit is not None and sent + len(piece) > limit:
                client.send(piece[: limit - sent])
                break
            client.send(piece)
            sent += len(piece)
        if isinstance(fault, DropMidResponse):
            upstream.close()
            if fault.pause:
                self._stop.wait(fault.pause)
            self._abort(client.sock, reset=fault.reset)
            return False

        if not (upstream_intact and response.keep_alive):
            upstream.close()
        return request.keep_alive and response.keep_alive

    def _read_response(self, up: _Stream, request_method: str) -> _Response:
        while True:
            raw = up.read_head()
            if raw is None:
                raise _Truncated("upstream closed the connection without responding")
            response = _parse_response(raw, request_method)
            # Interim responses are swallowed: the proxy already sent its own 100 Continue.
            if 100 <= response.status < 200 and response.status != 101:
                continue
            return response
