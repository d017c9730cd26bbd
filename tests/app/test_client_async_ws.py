"""quorra.client's asyncio WebSocket (``quorra/client/_async_ws.py``) against websockets'
own server on 127.0.0.1: messages whole (fragmented ones joined), pings answered, the
close handshake either way, a refused handshake with the server's answer, back-pressure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response

from quorra.client._async_ws import ClientWebSocket, connect

Handler = Callable[[ServerConnection], Awaitable[None]]


async def _with_server(handler: Handler, body: Callable[[str], Awaitable[None]]) -> None:
    def refuse(conn: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Authorization") != "Bearer ok":
            return Response(401, "Unauthorized", Headers(), b'{"status":401}')
        return None

    async with serve(handler, "127.0.0.1", 0, process_request=refuse) as server:
        port = server.sockets[0].getsockname()[1]
        await body(f"ws://127.0.0.1:{port}/s")


async def _open(url: str, got: list[bytes], token: str = "ok") -> ClientWebSocket:
    return await connect(
        url,
        {"Authorization": f"Bearer {token}"},
        on_message=got.append,
        open_timeout_s=5.0,
        max_size=1 << 20,
    )


def test_messages_whole_pings_answered_and_a_clean_close() -> None:
    async def handler(ws: ServerConnection) -> None:
        assert await ws.recv() == b"hello"
        await ws.send(b"one")
        await ws.send([b"fr", b"ag", b"ments"])  # a fragmented message
        await asyncio.wait_for(await ws.ping(), 5.0)  # the client answers with a pong
        await ws.send(b"two")
        await ws.wait_closed()

    async def body(url: str) -> None:
        got: list[bytes] = []
        conn = await _open(url, got)
        await conn.send(b"hello")
        for _ in range(200):
            if len(got) == 3:
                break
            await asyncio.sleep(0.01)
        assert got == [b"one", b"fragments", b"two"]
        await conn.close()
        assert conn.closed.done() and conn.close_error().rcvd is not None
        assert conn.close_error().rcvd.code == 1000
        with pytest.raises(ConnectionClosed):
            await conn.send(b"late")

    asyncio.run(_with_server(handler, body))


def test_a_close_from_the_server_ends_the_connection_with_its_code() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.close(4001, "bye")

    async def body(url: str) -> None:
        conn = await _open(url, [])
        await asyncio.wait_for(asyncio.shield(conn.closed), 5.0)
        closed = conn.close_error()
        assert closed.rcvd is not None and (closed.rcvd.code, closed.rcvd.reason) == (4001, "bye")
        with pytest.raises(ConnectionClosed):
            await conn.send(b"x")

    asyncio.run(_with_server(handler, body))


def test_a_refused_handshake_raises_with_the_servers_answer() -> None:
    async def handler(ws: ServerConnection) -> None:  # pragma: no cover - never admitted
        await ws.wait_closed()

    async def body(url: str) -> None:
        with pytest.raises(InvalidStatus) as refused:
            await _open(url, [], token="bad")
        assert refused.value.response.status_code == 401
        assert refused.value.response.body == b'{"status":401}'

    asyncio.run(_with_server(handler, body))


def test_a_peer_that_reads_nothing_holds_send_at_the_high_water_mark() -> None:
    release = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        ws.transport.pause_reading()
        await release.wait()
        ws.transport.resume_reading()
        async for _ in ws:
            pass

    async def body(url: str) -> None:
        conn = await _open(url, [])
        payload = b"x" * (256 * 1024)
        sends = 0
        while True:  # socket buffers fill, then the transport passes its high-water mark
            try:
                await asyncio.wait_for(conn.send(payload), 0.5)
            except TimeoutError:
                break
            sends += 1
            assert sends < 400, "send never waited"
        release.set()
        await asyncio.wait_for(conn.send(b"after"), 5.0)
        await conn.close()

    asyncio.run(_with_server(handler, body))


def test_frames_of_each_length_form_reach_websockets_whole_and_masked() -> None:
    """The client writes its binary frames itself: 7-bit, 16-bit and 64-bit lengths at
    their edges, each read by websockets' server (which refuses an unmasked frame)."""
    payloads = [bytes([n % 251]) * n for n in (0, 1, 125, 126, 127, 65535, 65536, 300_000)]

    async def handler(ws: ServerConnection) -> None:
        for _ in payloads:
            await ws.send(await ws.recv())
        await ws.wait_closed()

    async def body(url: str) -> None:
        got: list[bytes] = []
        conn = await _open(url, got)
        for payload in payloads:
            await conn.send(payload)
        for _ in range(500):
            if len(got) == len(payloads):
                break
            await asyncio.sleep(0.01)
        assert got == payloads
        await conn.close()

    asyncio.run(_with_server(handler, body))
