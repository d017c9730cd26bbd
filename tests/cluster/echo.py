"""A server that answers each frame of the cluster's framing (4-byte big-endian length,
then the body) with the same frame, and blocking client helpers to speak to it: what the
proxy tests put in place of a node."""

from __future__ import annotations

import asyncio
import socket

from bench._proxy import ProxyLoop

QUIET_S = 0.3
"""How long a test waits to see that nothing more arrives."""


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except (TimeoutError, ConnectionResetError):
            return None
        if not chunk:
            return None
        data += chunk
    return data


def recv_frame(sock: socket.socket, timeout_s: float = 2.0) -> bytes | None:
    """The next frame's body, or None when the connection ends or nothing comes in time."""
    sock.settimeout(timeout_s)
    header = recv_exactly(sock, 4)
    if header is None:
        return None
    return recv_exactly(sock, int.from_bytes(header, "big"))


def closed(sock: socket.socket, timeout_s: float = 2.0) -> bool:
    """Whether the peer closed ``sock`` (read end of stream or a reset) in time."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def handshake(sock: socket.socket) -> None:
    """Two exchanges with the echo server: four frames (up, down, up, down), as many as
    the proxy spares by default (``HANDSHAKE_FRAMES_DEFAULT``), like the cluster's own."""
    for body in (b"hello", b"auth"):
        sock.sendall(frame(body))
        assert recv_frame(sock) == body


class EchoServer:
    """Answers each frame with the same frame, and records what it received."""

    def __init__(self, loop: ProxyLoop) -> None:
        self.loop = loop
        self.received: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(header, "big"))
                self.received.append(body)
                writer.write(header + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()

    async def _start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    def start(self) -> EchoServer:
        self.port = self.loop.call(self._start())
        return self

    def close(self) -> None:
        self.loop.call(self._close())
