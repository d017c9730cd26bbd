"""The HTTP protocol uvicorn runs: its own, with each response leaving in one write.

uvicorn writes a response's head and its body to the transport separately: two
``send`` calls on the socket, two segments, and on loopback two wake-ups of the client,
per response. Those calls were the largest single cost of a small publish on the server
(profiled with ``quorra bench rest --profile``). ``CoalescingTransport`` gathers what is
written during one turn of the event loop and sends it at the end of that turn, in order,
as one write; closing sends what is gathered first. Nothing else of the protocol changes.
It is uvicorn's httptools protocol (a C parser; h11, pure Python, where httptools is
missing).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # httptools is optional: h11, uvicorn's pure-Python parser
    _Base = H11Protocol  # type: ignore[assignment,misc]


class CoalescingTransport:
    """A transport whose writes of one loop turn leave together."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingProtocol(_Base):
    """uvicorn's HTTP/1.1 protocol (httptools' parser when installed, else h11) over a
    ``CoalescingTransport``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
