"""Tests for the fault-injection proxy, against a tiny upstream HTTP server on loopback."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import cast

import pytest

from tests.faults.proxy import (
    FaultProxy,
    drop_before_response,
    drop_mid_request,
    drop_mid_response,
    stall,
    status,
)

MIB = 1024 * 1024


def _pattern(size: int) -> bytes:
    """Deterministic, non-repeating-looking bytes so truncation and reordering show up."""
    block = bytes(range(251))
    return (block * (size // len(block) + 1))[:size]


@dataclass(frozen=True)
class Seen:
    """One request as completed by the upstream."""

    method: str
    path: str
    body_bytes: int
    peer_port: int
    expect: str | None


class Upstream(ThreadingHTTPServer):
    """In-memory object store: PUT stores a body, GET returns it, GET /bytes/N makes N bytes."""

    # Handler threads are joined by server_close(), so no test leaves one behind.
    daemon_threads = False
    block_on_close = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), UpstreamHandler)
        self.objects: dict[str, bytes] = {}
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.hung_up = threading.Event()
        """Set once the server has closed a connection (its FIN is sent)."""

    @property
    def port(self) -> int:
        return int(self.socket.getsockname()[1])

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        super().shutdown_request(request)
        self.hung_up.set()

    def handle_error(self, request: object, client_address: object) -> None:
        # The proxy cuts connections on purpose; the resulting tracebacks are noise.
        pass


class UpstreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 5  # bounds every read, so a handler thread can never hang the teardown

    @property
    def store(self) -> Upstream:
        return cast(Upstream, self.server)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _note(self, body_bytes: int) -> None:
        with self.store.lock:
            self.store.seen.append(
                Seen(
                    self.command,
                    self.path,
                    body_bytes,
                    self.client_address[1],
                    self.headers.get("Expect"),
                )
            )

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._note(0)
        kind, _, size = self.path.rpartition("/")
        if kind == "/bytes":
            self._reply(200, _pattern(int(size)))
        elif kind == "/chunked":
            self._reply_chunked(_pattern(int(size)))
        elif kind == "/until-close":
            # HTTP/1.0-style framing: no length, the body ends when the connection does.
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(_pattern(int(size)))
            self.close_connection = True
        elif kind == "/then-hang-up":
            # A keep-alive response after which the server drops the idle connection anyway.
            self._reply(200, _pattern(int(size)))
            self.close_connection = True
        else:
            self._reply_stored()

    def _reply_stored(self) -> None:
        with self.store.lock:
            body = self.store.objects.get(self.path)
        self._reply(200, body) if body is not None else self._reply(404, b"no such object")

    def _reply_chunked(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for start in range(0, len(body), 1000):
            piece = body[start : start + 1000]
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")

    def do_PUT(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = self._read_chunked()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.store.lock:
            self.store.objects[self.path] = body
        self._note(len(body))
        self._reply(201, b"")

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(parts)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="test-upstream"
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail the test if it does not within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _queued(sock: socket.socket) -> int:
    """Bytes received on ``sock`` and not yet read."""
    try:
        return len(sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


def _proxy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fault-proxy-")]


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream=("127.0.0.1", upstream.port)) as fault_proxy:
        yield fault_proxy
    assert _proxy_threads() == []


Connect = Callable[..., http.client.HTTPConnection]


@pytest.fixture
def connect(proxy: FaultProxy) -> Iterator[Connect]:
    """Open http.client connections to the proxy; all are closed at teardown."""
    opened: list[http.client.HTTPConnection] = []

    def open_connection(timeout: float = 5.0) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


def _exchange(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    conn.request(method, path, body=body)
    response = conn.getresponse()
    return response.status, response.read()


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_get_and_a_five_mebibyte_put_pass_through_unchanged(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    payload = _pattern(5 * MIB)
    conn = connect()

    assert _exchange(conn, "PUT", "/big", payload) == (201, b"")
    assert _exchange(conn, "GET", "/big") == (200, payload)

    assert upstream.objects["/big"] == payload
    assert [(r.method, r.path, r.status, r.fault) for r in proxy.requests] == [
        ("PUT", "/big", 201, None),
        ("GET", "/big", 200, None),
    ]
    assert proxy.requests[0].request_body_bytes == 5 * MIB


def test_two_requests_share_one_keep_alive_connection_on_both_sides(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    conn = connect()
    assert _exchange(conn, "GET", "/bytes/10")[0] == 200
    client_socket = conn.sock
    assert _exchange(conn, "GET", "/bytes/20") == (200, _pattern(20))

    assert conn.sock is client_socket
    assert len(upstream.seen) == 2
    assert upstream.seen[0].peer_port == upstream.seen[1].peer_port


def test_chunked_request_bodies_are_relayed_intact(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    conn = connect()
    conn.request("PUT", "/chunked", body=iter([b"abc", b"", b"defgh", _pattern(70_000)]))
    response = conn.getresponse()
    response.read()

    assert response.status == 201
    assert upstream.objects["/chunked"] == b"abcdefgh" + _pattern(70_000)


def test_chunked_and_read_until_close_responses_are_relayed_intact(
    proxy: FaultProxy, connect: Connect
) -> None:
    conn = connect()
    assert _exchange(conn, "GET", "/chunked/5500") == (200, _pattern(5500))
    assert _exchange(conn, "GET", "/until-close/70000") == (200, _pattern(70_000))

    assert [r.status for r in proxy.requests] == [200, 200]


def test_an_upstream_that_hung_up_on_an_idle_connection_is_reconnected(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    conn = connect()
    assert _exchange(conn, "GET", "/then-hang-up/10") == (200, _pattern(10))
    # The upstream closes the idle connection, as it would after an idle timeout.
    assert upstream.hung_up.wait(5), "the upstream never closed the connection"
    assert _exchange(conn, "GET", "/bytes/10") == (200, _pattern(10))

    assert upstream.seen[0].peer_port != upstream.seen[1].peer_port
    assert all(r.error is None for r in proxy.requests)


def test_expect_100_continue_is_answered_by_the_proxy_and_not_forwarded(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PUT /expect HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert _read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"hello")
        assert _read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 201 ")

    assert upstream.objects["/expect"] == b"hello"
    assert upstream.seen[0].expect is None


def test_status_fault_answers_the_next_two_requests_then_passes_through(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(status(503, b"slow down", {"X-Fault": "yes"}, retry_after=1), times=2)
    conn = connect()

    outcomes = []
    for _ in range(3):
        conn.request("GET", "/bytes/4")
        response = conn.getresponse()
        outcomes.append((response.status, response.getheader("Retry-After"), response.read()))

    assert outcomes == [
        (503, "1", b"slow down"),
        (503, "1", b"slow down"),
        (200, None, _pattern(4)),
    ]
    assert len(upstream.seen) == 1
    assert [r.fault for r in proxy.requests] == ["status", "status", None]


def test_status_fault_reads_and_discards_the_request_body(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(status(500))
    conn = connect()

    assert _exchange(conn, "PUT", "/x", _pattern(MIB)) == (500, b"")
    assert _exchange(conn, "PUT", "/x", b"second") == (201, b"")

    assert upstream.objects["/x"] == b"second"
    assert proxy.requests[0].request_body_bytes == MIB


def test_drop_before_response_lets_the_upstream_finish_but_resets_the_client(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(drop_before_response())

    with pytest.raises(ConnectionError):
        _exchange(connect(), "PUT", "/landed", b"payload")

    assert upstream.objects["/landed"] == b"payload"
    record = proxy.requests[0]
    assert (record.fault, record.status, record.upstream_status) == (
        "drop_before_response",
        None,
        201,
    )
    assert _exchange(connect(), "GET", "/landed") == (200, b"payload")


def test_drop_before_response_without_reset_closes_gracefully(proxy: FaultProxy, connect: Connect) -> None:
    proxy.add_fault(drop_before_response(reset=False))

    with pytest.raises(http.client.RemoteDisconnected):
        _exchange(connect(), "GET", "/bytes/1")


def test_drop_mid_response_cuts_the_body_and_the_client_sees_an_incomplete_read(
    proxy: FaultProxy, connect: Connect
) -> None:
    proxy.add_fault(drop_mid_response(after_bytes=1000, reset=False))
    conn = connect()
    conn.request("GET", "/bytes/100000")
    response = conn.getresponse()

    assert response.status == 200
    with pytest.raises(http.client.IncompleteRead) as excinfo:
        response.read()
    assert excinfo.value.partial == _pattern(1000)
    assert proxy.requests[0].fault == "drop_mid_response"


def test_drop_mid_response_with_reset_delivers_exactly_the_promised_bytes_then_a_rst(
    proxy: FaultProxy,
) -> None:
    proxy.add_fault(drop_mid_response(after_bytes=2 * MIB))
    received = b""
    with socket.socket() as sock:
        # A small receive window and a late reader leave most of the promised bytes queued in
        # the proxy when it decides to reset; they must still arrive before the RST.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.settimeout(5)
        sock.connect(("127.0.0.1", proxy.port))
        sock.sendall(b"GET /bytes/4194304 HTTP/1.1\r\nHost: x\r\n\r\n")
        # Read only once the proxy has started the response and filled the receive window.
        wait_until(lambda: [r.status for r in proxy.requests] == [200] and _queued(sock) > 0)
        # A FIN would end this loop normally and fail the test: the close must be a reset.
        with pytest.raises(ConnectionResetError):  # noqa: PT012
            while chunk := sock.recv(65536):
                received += chunk

    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert body == _pattern(2 * MIB)


def test_drop_mid_request_resets_the_client_before_the_upstream_sees_anything(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(drop_mid_request(after_bytes=64 * 1024))

    with pytest.raises(ConnectionError):
        _exchange(connect(), "PUT", "/partial", _pattern(5 * MIB))

    assert upstream.seen == []
    assert "/partial" not in upstream.objects
    record = proxy.requests[0]
    assert (record.fault, record.status, record.request_body_bytes) == (
        "drop_mid_request",
        None,
        64 * 1024,
    )


def test_stall_makes_the_client_time_out_and_stop_interrupts_it_promptly(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(stall(30))

    with pytest.raises(TimeoutError):
        _exchange(connect(timeout=0.3), "GET", "/bytes/1")

    started = time.monotonic()
    proxy.stop()
    assert time.monotonic() - started < 1.0
    assert _proxy_threads() == []
    assert upstream.seen == []
    assert proxy.requests[0].fault == "stall"


def test_stall_with_forward_delays_the_upstream_response(
    proxy: FaultProxy, upstream: Upstream, connect: Connect
) -> None:
    proxy.add_fault(stall(0.3, forward=True))

    started = time.monotonic()
    assert _exchange(connect(), "PUT", "/slow", b"data") == (201, b"")

    assert time.monotonic() - started >= 0.3
    assert upstream.objects["/slow"] == b"data"


def test_method_predicate_applies_the_fault_only_to_puts(proxy: FaultProxy, connect: Connect) -> None:
    proxy.add_fault(status(500), method="PUT")
    conn = connect()

    assert _exchange(conn, "GET", "/bytes/3")[0] == 200
    assert _exchange(conn, "PUT", "/a", b"1")[0] == 500
    assert _exchange(conn, "PUT", "/a", b"1")[0] == 201


def test_path_predicate_applies_the_fault_only_to_matching_targets(
    proxy: FaultProxy, connect: Connect
) -> None:
    proxy.add_fault(status(404), times=None, path_contains="uploadId")
    conn = connect()

    assert _exchange(conn, "PUT", "/obj?partNumber=1&uploadId=7", b"p")[0] == 404
    assert _exchange(conn, "PUT", "/obj", b"whole")[0] == 201
    assert _exchange(conn, "PUT", "/obj?partNumber=2&uploadId=7", b"p")[0] == 404
    proxy.clear_faults()
    assert _exchange(conn, "PUT", "/obj?partNumber=3&uploadId=7", b"p")[0] == 201


def test_faults_added_in_sequence_fire_in_order_then_traffic_passes_through(
    proxy: FaultProxy, connect: Connect
) -> None:
    proxy.add_fault(status(429, retry_after=0))
    proxy.add_fault(drop_before_response())
    proxy.add_fault(status(500))

    assert _exchange(connect(), "GET", "/bytes/1")[0] == 429
    with pytest.raises(ConnectionError):
        _exchange(connect(), "GET", "/bytes/1")
    assert _exchange(connect(), "GET", "/bytes/1")[0] == 500
    assert _exchange(connect(), "GET", "/bytes/1")[0] == 200


def test_request_log_counts_attempts_and_their_outcomes(proxy: FaultProxy, connect: Connect) -> None:
    proxy.add_fault(status(503), times=2, method="PUT")
    conn = connect()
    for _ in range(3):
        _exchange(conn, "PUT", "/retried", b"body")
    _exchange(conn, "GET", "/retried")

    puts = [r for r in proxy.requests if r.method == "PUT"]
    assert len(puts) == 3
    assert sum(r.status == 503 for r in puts) == 2
    assert [(r.fault, r.status, r.upstream_status) for r in puts] == [
        ("status", 503, None),
        ("status", 503, None),
        (None, 201, 201),
    ]
    assert all(r.request_body_bytes == 4 and r.error is None for r in puts)
    proxy.clear_requests()
    assert proxy.requests == []


def test_unreachable_upstream_is_reported_as_bad_gateway() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # nothing listens once it is closed
    with FaultProxy(upstream=("127.0.0.1", dead_port)) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        with closing(conn):
            code, _ = _exchange(conn, "GET", "/")
        assert code == 502
        assert proxy.requests[0].error is not None
    assert _proxy_threads() == []


def test_stop_closes_idle_keep_alive_connections_and_is_idempotent(
    proxy: FaultProxy,
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"GET /bytes/2 HTTP/1.1\r\nHost: x\r\n\r\n")
        response = _read_until(sock, b"\r\n\r\n")
        while not response.endswith(_pattern(2)):
            response += sock.recv(100)
        assert response.startswith(b"HTTP/1.1 200 ")

        proxy.stop()
        proxy.stop()

        try:
            after_stop = sock.recv(100)
        except ConnectionResetError:
            after_stop = b""
    assert after_stop == b""
    assert _proxy_threads() == []
