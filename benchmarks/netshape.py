"""A loopback TCP proxy that shapes every connection like a slower, farther network.

Each accepted connection to ``127.0.0.1:<port>`` is forwarded to ``127.0.0.1:<upstream>``, and in
each direction its bytes are

* capped by a token bucket at ``rate_mib_s`` MiB/s (per connection, per direction), and
* held back by half the round-trip time before they are passed on, so the delay applies to
  every byte in flight (request, response, each part), not only to connection set-up.

It also counts what a benchmark wants to report: connections, the peak number open at once,
bytes, and HTTP requests (request lines seen client to server, by method). A connection to
``mark_port`` resets those counters, so a measured process can start them after its warm-up.

Use it from a program (``ShapedProxy`` in a thread of its own, or ``Shaper`` on a running event
loop) or standalone: ``python benchmarks/netshape.py --upstream 9000 --rate-mib 8 --rtt-ms 20``.
Loopback only: it neither listens on nor connects to any other address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

LOOPBACK = "127.0.0.1"
MIB = 1 << 20
READ_BYTES = 64 * 1024
BURST_BYTES = 64 * 1024  # the token bucket's depth: one read's worth, so rates hold at small scale
QUEUE_CHUNKS = 64  # chunks in flight per direction before the reader waits for the writer
_REQUEST_LINE = re.compile(rb"(GET|PUT|POST|HEAD|DELETE|PATCH|OPTIONS) [^ \r\n]+ HTTP/1\.[01]\r\n")
_TAIL_BYTES = 2048  # a request line split across two reads is still seen once
_VERSION_MARK = b" HTTP/1."  # every request line has it; body bytes almost never do


@dataclass
class Stats:
    """What passed through the proxy since it started or was last reset."""

    connections: int = 0
    open_connections: int = 0
    peak_connections: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    bytes_up: int = 0
    bytes_down: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "peak_connections": self.peak_connections,
            "requests": sum(self.requests.values()),
            "requests_by_method": dict(self.requests),
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
        }


class TokenBucket:
    """Lets ``rate`` bytes per second through; a read larger than the tokens waits off its debt."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate = rate_bytes_s
        self.tokens = float(BURST_BYTES)
        self.stamp = time.monotonic()

    async def take(self, count: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.tokens = min(float(BURST_BYTES), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= count
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


class Shaper:
    """The proxy on the running event loop: ``await start()``, ``await stop()``."""

    def __init__(self, upstream_port: int, rate_mib_s: float, rtt_ms: float, port: int = 0) -> None:
        self.upstream_port = upstream_port
        self.rate_bytes_s = rate_mib_s * MIB
        self.one_way_s = rtt_ms / 2000.0
        self.port = port
        self.stats = Stats()
        self.mark_port = 0
        self._server: asyncio.Server | None = None
        self._mark_server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self._mark_server = await asyncio.start_server(self._mark, LOOPBACK, 0)
        self.mark_port = self._mark_server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for server in (self._server, self._mark_server):
            if server is not None:
                server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for server in (self._server, self._mark_server):
            if server is not None:
                await server.wait_closed()

    async def _mark(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection to ``mark_port`` resets the counters; closing it says that is done.

        A measured process connects here after its warm-up, so only its operation is counted.
        """
        self.reset()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    def reset(self) -> None:
        """Start counting afresh (open connections stay counted as open)."""
        stats = self.stats  # in place: connections still open keep counting into it
        stats.connections = stats.bytes_up = stats.bytes_down = 0
        stats.peak_connections = stats.open_connections
        stats.requests.clear()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        stats = self.stats
        stats.connections += 1
        stats.open_connections += 1
        stats.peak_connections = max(stats.peak_connections, stats.open_connections)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            client_writer.close()
            stats.open_connections -= 1
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(
                self._pipe(client_reader, upstream_writer, stats, upstream=True),
                self._pipe(upstream_reader, client_writer, stats, upstream=False),
            )
        except (OSError, asyncio.IncompleteReadError):
            pass  # one side reset: the other is closed below
        except asyncio.CancelledError:
            pass  # stop(): end quietly (asyncio reports a handler that ends cancelled as an error)
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
            stats.open_connections -= 1
            self._tasks.discard(task)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: Stats, upstream: bool
    ) -> None:
        """Read at the capped rate; deliver each chunk one half-RTT after it was read."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        bucket = TokenBucket(self.rate_bytes_s)

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        tail = b""
        try:
            while True:
                chunk = await reader.read(READ_BYTES)
                if upstream:
                    stats.bytes_up += len(chunk)
                    tail = self._count_requests(tail, chunk, stats)
                else:
                    stats.bytes_down += len(chunk)
                if chunk:
                    await bucket.take(len(chunk))
                item = (time.monotonic() + self.one_way_s, chunk)
                if queue.full():
                    # Wait for room, or for the writer to fail (peer gone): never wait forever.
                    room = asyncio.ensure_future(queue.put(item))
                    await asyncio.wait({room, delivering}, return_when=asyncio.FIRST_COMPLETED)
                    if not room.done():
                        room.cancel()
                        delivering.result()  # raises the writer's error
                        return
                else:
                    queue.put_nowait(item)
                if not chunk:
                    break
            await delivering
        finally:
            delivering.cancel()

    @staticmethod
    def _count_requests(tail: bytes, chunk: bytes, stats: Stats) -> bytes:
        # Most chunks are body bytes: a substring search (C speed) rules them out before the
        # regular expression scans anything. At 100+ MiB/s the scan of every chunk made this
        # proxy the busiest process on the machine, a limit no real network has.
        if _VERSION_MARK not in tail[-len(_VERSION_MARK) :] + chunk[: len(_VERSION_MARK)] and (
            _VERSION_MARK not in chunk
        ):
            return (tail + chunk)[-_TAIL_BYTES:] if len(chunk) < _TAIL_BYTES else chunk[-_TAIL_BYTES:]
        window = tail + chunk
        for match in _REQUEST_LINE.finditer(window):
            if match.end() > len(tail):  # not already counted with the previous read
                stats.requests[match.group(1).decode()] += 1
        return window[-_TAIL_BYTES:]


class ShapedProxy:
    """A ``Shaper`` on its own event loop in a daemon thread, for synchronous programs.

    ``with ShapedProxy(upstream, 8, 20) as proxy:`` listens on ``proxy.port`` until the block ends.
    """

    def __init__(self, upstream_port: int, rate_mib_s: float, rtt_ms: float, port: int = 0) -> None:
        self.shaper = Shaper(upstream_port, rate_mib_s, rtt_ms, port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="netshape", daemon=True)

    @property
    def port(self) -> int:
        return self.shaper.port

    @property
    def mark_port(self) -> int:
        return self.shaper.mark_port

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> ShapedProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.shaper.start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.shaper.stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def reset(self) -> None:
        self._loop.call_soon_threadsafe(self.shaper.reset)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result(timeout=10)

    def snapshot(self) -> dict[str, Any]:
        async def take() -> dict[str, Any]:
            return self.shaper.stats.snapshot()

        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout=10)

    def __enter__(self) -> ShapedProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--upstream", type=int, required=True, help="upstream port on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    parser.add_argument("--rate-mib", type=float, default=8.0, help="MiB/s per connection and direction")
    parser.add_argument("--rtt-ms", type=float, default=20.0, help="added round-trip time in ms")
    args = parser.parse_args()

    async def serve() -> None:
        shaper = Shaper(args.upstream, args.rate_mib, args.rtt_ms, args.port)
        await shaper.start()
        print(f"http://{LOOPBACK}:{shaper.port} -> {LOOPBACK}:{args.upstream}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            print(shaper.stats.snapshot(), flush=True)
            await shaper.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
