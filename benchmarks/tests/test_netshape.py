"""The benchmark's shaping proxy caps bandwidth, delays data in flight and counts what passed.

Only lower bounds on time, with generous margins: a loaded machine makes transfers slower,
never faster, so these cannot flake the other way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from benchmarks import netshape

MIB = 1 << 20


async def _sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers ``ping`` with ``pong``; otherwise reads to the end and answers how many bytes it got."""
    first = await reader.readexactly(5)
    if first == b"ping\n":
        writer.write(b"pong\n")
    else:
        total = len(first) + len(await reader.read())
        writer.write(str(total).encode())
    await writer.drain()
    writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    server = await asyncio.start_server(_sink, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def _send(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    writer.write_eof()
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_transfer_through_the_proxy_is_capped_to_the_configured_rate(upstream: int) -> None:
    shaper = netshape.Shaper(upstream, rate_mib_s=4, rtt_ms=0)
    await shaper.start()
    try:
        started = time.monotonic()
        answer = await _send(shaper.port, b"x" * (2 * MIB) + b"\n")  # 2 MiB + 1
        elapsed = time.monotonic() - started
    finally:
        await shaper.stop()
    assert int(answer) == 2 * MIB + 1
    assert elapsed >= 0.5 * (2 / 4), f"2 MiB at 4 MiB/s took only {elapsed:.3f} s"


async def test_every_exchange_through_the_proxy_waits_at_least_the_round_trip(upstream: int) -> None:
    shaper = netshape.Shaper(upstream, rate_mib_s=0, rtt_ms=200)
    await shaper.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", shaper.port)
        started = time.monotonic()
        writer.write(b"ping\n")
        await writer.drain()
        answer = await reader.readline()
        elapsed = time.monotonic() - started
        writer.close()
    finally:
        await shaper.stop()
    assert answer == b"pong\n"
    assert elapsed >= 0.15, f"a ping-pong with 200 ms RTT took only {elapsed:.3f} s"


async def test_the_proxy_counts_http_requests_connections_and_the_peak_open_at_once(upstream: int) -> None:
    shaper = netshape.Shaper(upstream, rate_mib_s=0, rtt_ms=0)
    await shaper.start()
    try:
        head = b"PUT /bucket/key HTTP/1.1\r\nHost: x\r\n\r\n" + b"body" * 10
        split = b"GET /bucket/key?partNumber=1 HT"
        rest = b"TP/1.1\r\nHost: x\r\n\r\n"
        # Two connections at once; the second request line arrives in two reads.
        reader, writer = await asyncio.open_connection("127.0.0.1", shaper.port)
        writer.write(split)
        await writer.drain()
        await asyncio.sleep(0.05)
        other = asyncio.ensure_future(_send(shaper.port, head))
        await asyncio.sleep(0.05)
        writer.write(rest)
        writer.write_eof()
        await reader.read()
        writer.close()
        await other
        stats = shaper.stats.snapshot()
    finally:
        await shaper.stop()
    assert stats["requests_by_method"] == {"PUT": 1, "GET": 1}
    assert stats["connections"] == 2
    assert stats["peak_connections"] == 2


async def test_a_connection_to_the_mark_port_resets_the_counters(upstream: int) -> None:
    shaper = netshape.Shaper(upstream, rate_mib_s=0, rtt_ms=0)
    await shaper.start()
    try:
        await _send(shaper.port, b"GET / HTTP/1.1\r\n\r\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", shaper.mark_port)
        assert await reader.read() == b""  # closed once the counters are reset
        writer.close()
        stats = shaper.stats.snapshot()
    finally:
        await shaper.stop()
    assert stats["requests"] == 0
    assert stats["connections"] == 0
