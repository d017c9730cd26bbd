"""The HTTP protocol uvicorn runs: its own, with each response leaving in one write.

uvicorn writes a response's head and its body to the transport separately: two
``send`` calls on the socket, two segments, and on loopback two wake-ups of the client,
per response. Those calls were the largest single cost of a small publish on the server
(profiled with ``quorra bench rest --profile``). ``CoalescingTransport`` gathers what is
written during one turn of the event loop and sends it at the end of that turn, in order,
as one write (``writelines``: one ``writev`` under uvloop, the pieces not joined into a
copy); closing sends what is gathered first. Nothing else of the protocol changes.
It is uvicorn's httptools protocol (a C parser; h11, pure Python, where httptools is
missing).

Its response heads are written by ``CheckedHeadersCycle`` (app/http_cycle.py), which
checks a header line once, not on every response.

It keeps a request's body as the chunks that arrived (``ReceivedBody``) rather than
uvicorn's growing ``bytearray``, which the app's read then copied once more: a batch of
100 messages (some 100 KiB, two or three chunks) was copied twice into freshly mapped
memory on its way in, about a twentieth of the server's CPU per published batch.

It also bounds the time to send a request's headers, which uvicorn does not: a
connection that sends no bytes, or only part of a request line or of its headers, would
otherwise stay open for ever (a few thousand such sockets exhaust the process's file
descriptors). The clock starts when the connection opens and again when a response
ends; when it runs out and no request with complete headers is being answered, the
connection is closed (not once it is upgraded to a WebSocket). An idle keep-alive
connection is closed sooner, by uvicorn's ``timeout_keep_alive``. Bodies and the handling of a request have no such bound here
(long polls wait by design; bodies are bounded in size).

On an upgrade, uvicorn hands the WebSocket protocol the request's head rebuilt from the
parsed request and drops whatever followed the head in the chunk it ended in: a client
that sends its first frames in the same TCP write as the handshake (which RFC 6455
allows) lost them, and a publish among them was never confirmed. Those bytes are handed
on, after the head, in order.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from httptools import HttpParserUpgrade
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from app.http_cycle import CheckedHeadersCycle
except ImportError:  # httptools is optional: h11, uvicorn's pure-Python parser
    _Base = H11Protocol  # type: ignore[assignment,misc]
    RequestResponseCycle = CheckedHeadersCycle = None  # type: ignore[assignment,misc]


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

    @property
    def plain(self) -> asyncio.Transport:
        """The transport written to."""
        return self._transport

    def flush(self) -> None:
        """Send what is gathered now."""
        self._flush()

    def _flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._transport.is_closing():
            return
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            # uvloop sends the pieces with one writev: no copy joining a response's head
            # and its body (a batch of messages is some 100 KiB, mapped afresh if joined)
            self._transport.writelines(pending)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        """Asked after every response: a method, not a lookup through ``__getattr__``."""
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ReceivedBody:
    """What arrived of a request's body since the app last read it, in the three ways
    uvicorn's cycle uses its ``body``: ``+=`` a chunk, ``len``, and ``bytes`` when the
    app reads (``receive``). The chunks are kept as they are: ``bytes`` of one chunk is
    that chunk (no copy), of several one join."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def __iadd__(self, chunk: bytes) -> ReceivedBody:
        self.chunks.append(chunk)
        self.size += len(chunk)
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class CoalescingProtocol(_Base):
    """uvicorn's HTTP/1.1 protocol (httptools' parser when installed, else h11) over a
    ``CoalescingTransport``, with a header-read timeout (``http_protocol`` sets it)."""

    header_read_timeout_s: ClassVar[float] = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _header_due: float | None = None
    """When the headers due are late (loop time); None when none are due."""

    _received: bytes = b""
    """The chunk being parsed (only while it is): an upgrade's request head may end
    inside it, followed by the WebSocket's first bytes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._received = data
        try:
            super().data_received(data)
        finally:
            self._received = b""

    def on_headers_complete(self) -> None:
        """uvicorn's, whose new cycle (its task started, not yet run) becomes a
        ``CheckedHeadersCycle`` (app/http_cycle.py): the same object, whose response head
        skips the checks of header lines already checked."""
        super().on_headers_complete()
        cycle = self.cycle
        if RequestResponseCycle is not None and type(cycle) is RequestResponseCycle:
            cycle.__class__ = CheckedHeadersCycle

    def on_body(self, body: bytes) -> None:
        """uvicorn's, into a ``ReceivedBody``: the cycle starts with an empty
        ``bytearray`` and gets a new one after each read, the only times it holds one."""
        cycle = self.cycle
        if type(cycle.body) is bytearray:
            assert not cycle.body, len(cycle.body)
            cycle.body = ReceivedBody()  # type: ignore[assignment]
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._start_header_timer()  # the next request's headers

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """The connection becomes a WebSocket (a stream, app/api/stream.py), which lives
        as long as its peers want: no request headers are due on it any more. Its
        protocol writes each frame whole, so it gets the plain transport: gathering
        would hold every confirm and delivery back until the loop's next turn (a
        publish with one outstanding waits for each confirm)."""
        self._stop_header_timer()
        after_head = self._after_head()
        transport = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()  # what was gathered before the upgrade leaves first
            self.transport = transport.plain
        super().handle_websocket_upgrade(*args)
        if after_head:
            # uvicorn fed the new protocol the head only; what followed comes next, in
            # order (later chunks reach it directly: it is the transport's protocol now).
            protocol = self.transport.get_protocol()
            assert isinstance(protocol, asyncio.Protocol), protocol
            protocol.data_received(after_head)

    def _after_head(self) -> bytes:
        """The bytes received after an upgrade's request head. h11 keeps them as its
        trailing data; httptools' parser stops at the head's end and says where in the
        chunk fed last, in the ``HttpParserUpgrade`` uvicorn is handling as it calls
        ``handle_websocket_upgrade``."""
        if isinstance(self, H11Protocol):
            return bytes(self.conn.trailing_data[0])
        upgrade = sys.exception()
        assert isinstance(upgrade, HttpParserUpgrade), upgrade
        return self._received[upgrade.args[0] :]

    def _start_header_timer(self) -> None:
        """Headers are due ``header_read_timeout_s`` from now. A timer already armed
        (for an earlier, closer time) is kept and moved on when it fires: a keep-alive
        connection starts the clock after every response, and a timer made and
        cancelled per response was a cost on every request."""
        self._header_due = self.loop.time() + self.header_read_timeout_s
        if self._header_timer is None:
            self._header_timer = self.loop.call_at(self._header_due, self._headers_late)

    def _stop_header_timer(self) -> None:
        self._header_due = None
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        """Close, unless a request whose headers arrived is being answered (its response
        starts the clock again when it ends), or the clock started again since."""
        self._header_timer = None
        due = self._header_due
        if due is None:
            return
        if self.loop.time() < due:
            self._header_timer = self.loop.call_at(due, self._headers_late)
            return
        answering = self.cycle is not None and not self.cycle.response_complete
        if not answering and not self.transport.is_closing():
            self.transport.close()


def http_protocol(header_read_timeout_s: float) -> type[CoalescingProtocol]:
    """The protocol class for uvicorn's ``http``, with this header-read timeout."""
    assert header_read_timeout_s > 0
    return type(
        "QuorraHttpProtocol",
        (CoalescingProtocol,),
        {"header_read_timeout_s": header_read_timeout_s},
    )
