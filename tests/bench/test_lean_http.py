"""The benches' lean HTTP/1.1 client (``bench._lean_http``) against a server of a few
lines on 127.0.0.1: requests on one kept-alive connection, answers read by their
``Content-Length``, ``Connection: close`` honoured, an answer without a length refused."""

from __future__ import annotations

import asyncio

import pytest

from bench._lean_http import LeanHttp, _parse_head


def test_the_head_gives_status_length_and_close() -> None:
    head = b"HTTP/1.1 201 Created\r\ncontent-length: 12\r\nConnection: close\r\n\r\n"
    assert _parse_head(head) == (201, 12, True)
    assert _parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") == (200, 0, False)
    with pytest.raises(ValueError, match="without Content-Length"):
        _parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")


def test_requests_share_a_connection_until_the_server_closes_it() -> None:
    seen: list[tuple[int, bytes, bytes]] = []
    """(connection number, request head, request body) in arrival order."""
    ended: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = len({c for c, _, _ in seen}) + 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            seen.append((conn, head, body))
            answer = b'{"echo": ' + body + b"}"
            close = b"Connection: close\r\n" if body == b"3" else b""
            writer.write(
                b"HTTP/1.1 200 OK\r\n"
                + close
                + b"Content-Length: "
                + str(len(answer)).encode()
                + b"\r\n\r\n"
                + answer
            )
            await writer.drain()
            if close:
                break
        writer.close()
        await writer.wait_closed()
        ended.append(conn)

    async def body() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = LeanHttp(f"http://127.0.0.1:{port}", "tok")
        try:
            answers = [await http.post("/api/v1/x", str(k).encode()) for k in range(1, 6)]
        finally:
            http.close()
            async with asyncio.timeout(5):
                while len(ended) < 2:  # both connections' ends seen by the server
                    await asyncio.sleep(0.01)
            server.close()
            await server.wait_closed()
        assert answers == [(200, b'{"echo": %d}' % k) for k in range(1, 6)]
        # The first three on one connection (the third was answered with a close), the
        # rest on a new one.
        assert [c for c, _, _ in seen] == [1, 1, 1, 2, 2]
        assert all(b"Authorization: Bearer tok\r\n" in head for _, head, _ in seen)
        assert all(head.startswith(b"POST /api/v1/x HTTP/1.1\r\n") for _, head, _ in seen)

    asyncio.run(body())
