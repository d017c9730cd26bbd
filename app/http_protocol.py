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
connection is closed sooner, after uvicorn's ``timeout_keep_alive`` without a byte. Bodies
and the handling of a request have no such bound here (long polls wait by design; bodies
are bounded in size). Both clocks share one timer per connection, moved on when it fires:
uvicorn made a keep-alive timer after every response and cancelled it when the next
request's first bytes arrived, two timer operations per request.

A response leaves as soon as it is complete (``on_response_complete``), not at the end of
the loop's turn: what remains of the turn (other connections' requests, the WAL's
completions) no longer delays it, and nothing follows it on the connection before the
next request.

On an upgrade, uvicorn hands the WebSocket protocol the request's head rebuilt from the
parsed request and drops whatever followed the head in the chunk it ended in: a client
that sends its first frames in the same TCP write as the handshake (which RFC 6455
allows) lost them, and a publish among them was never confirmed. Those bytes are handed
on, after the head, in order.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import Any, ClassVar
from urllib.parse import unquote

from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from httptools import HttpParserUpgrade, parse_url
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base

    from app.http_cycle import CheckedHeadersCycle, RequestEvent
except ImportError:  # httptools is optional: h11, uvicorn's pure-Python parser
    _Base = H11Protocol  # type: ignore[assignment,misc]
    CheckedHeadersCycle = None  # type: ignore[assignment,misc]


class CoalescingTransport:
    """A transport whose writes of one loop turn leave together."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False
        """A flush at the end of this turn of the loop is scheduled."""

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._pending.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._turn_ended)

    def hold(self, data: bytes) -> None:
        """Gather ``data`` without scheduling a flush: what sends it is the next
        ``flush`` (the end of the response, ``on_response_complete``), or the end of
        the turn of a later ``write``. For a response's head, whose body follows in the
        same turn on nearly every response: the flush scheduled for it found nothing
        left to send once the response's end had sent it, and cost a callback of the
        loop per request."""
        if data:
            self._pending.append(data)

    def _turn_ended(self) -> None:
        self._scheduled = False
        self.flush()

    @property
    def plain(self) -> asyncio.Transport:
        """The transport written to."""
        return self._transport

    def flush(self) -> None:
        """Send what is gathered now."""
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
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        """Asked after every response: a method, not a lookup through ``__getattr__``."""
        return self._transport.is_closing()

    # The rest of ``asyncio.Transport``, handed on. Not through ``__getattr__``: a class
    # that has one reads every attribute of its instances through a slower hook, and
    # the protocol and its cycle read this transport's several times per request.

    def writelines(self, pieces: Iterable[bytes]) -> None:
        for data in pieces:
            self.write(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if default is None:
            return self._transport.get_extra_info(name)
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


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
    _header_due: float | None = None
    """When the headers due are late (loop time); None when none are due."""
    _idle_due: float | None = None
    """When an idle keep-alive connection is closed (loop time); None unless idle since
    its last response."""
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0
    """When ``_timer`` fires: never after the earlier of the two dues."""

    _received: bytes = b""
    """The chunk being parsed (only while it is): an upgrade's request head may end
    inside it, followed by the WebSocket's first bytes."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._received = data
        try:
            super().data_received(data)
        finally:
            self._received = b""

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn's, called as bytes arrive and as a response ends: the connection is
        no longer idle. uvicorn's own timer is made only by h11's
        ``on_response_complete`` (httptools': see ``on_response_complete``)."""
        self._idle_due = None
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None

    def on_headers_complete(self) -> None:
        """uvicorn's (0.54, httptools), its cycle made a ``CheckedHeadersCycle``
        (app/http_cycle.py), whose response head skips the checks of header lines
        already checked. The same steps, without its ``super`` call and a cycle made of
        one class then turned into the other (both a cost on every request)."""
        if CheckedHeadersCycle is None:  # h11
            super().on_headers_complete()
            return
        parser = self.parser
        scope = self.scope
        http_version = parser.get_http_version()
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        root_path = self.root_path
        scope["path"] = root_path + path
        scope["raw_path"] = root_path.encode("ascii") + raw_path if root_path else raw_path
        scope["query_string"] = parsed_url.query or b""
        limit = self.limit_concurrency
        app = self.app
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing_cycle = self.cycle
        self.cycle = cycle = CheckedHeadersCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=RequestEvent(),  # type: ignore[arg-type]
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if existing_cycle is None or existing_cycle.response_complete:
            self._start_asgi_task(cycle, app)
        else:  # pipelined: queued up
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        """uvicorn's, without the done callback that took the task out of ``tasks``:
        a ``CheckedHeadersCycle`` takes its task out itself as it ends (``run_asgi``),
        and the callback was one more call scheduled on the loop per request. (A task
        cancelled before its first step, as a forced stop's may be, stays in ``tasks``:
        nothing waits for them after a cancel.)"""
        if not isinstance(cycle, CheckedHeadersCycle) or self.config.reset_contextvars:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(cycle.run_asgi(app))
        self.tasks.add(task)
        cycle.task = task
        cycle.tasks = self.tasks

    def on_body(self, body: bytes) -> None:
        """uvicorn's, into a ``ReceivedBody``: the cycle starts with an empty
        ``bytearray`` and gets a new one after each read, the only times it holds one."""
        cycle = self.cycle
        if type(cycle.body) is bytearray:
            assert not cycle.body, len(cycle.body)
            cycle.body = ReceivedBody()  # type: ignore[assignment]
        super().on_body(body)

    def on_response_complete(self) -> None:
        """uvicorn's (httptools), the response sent at once, the keep-alive clock on the
        shared timer (h11's is its own, then the header clock)."""
        transport = self.transport
        if isinstance(transport, CoalescingTransport):
            transport.flush()
        if CheckedHeadersCycle is None:  # h11
            super().on_response_complete()
            if not transport.is_closing():
                self._start_header_timer()
            return
        self.server_state.total_requests += 1
        if transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            self._start_header_timer()
            return
        now = self.loop.time()
        self._idle_due = now + self.timeout_keep_alive
        self._header_due = now + self.header_read_timeout_s  # the next request's headers
        self._arm(min(self._idle_due, self._header_due))

    def handle_websocket_upgrade(self, *args: Any) -> None:
        """The connection becomes a WebSocket (a stream, app/api/stream.py), which lives
        as long as its peers want: no request headers are due on it any more. Its
        protocol writes each frame whole, so it gets the plain transport: gathering
        would hold every confirm and delivery back until the loop's next turn (a
        publish with one outstanding waits for each confirm)."""
        self._stop_timer()
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
        """Headers are due ``header_read_timeout_s`` from now."""
        self._header_due = self.loop.time() + self.header_read_timeout_s
        self._arm(self._header_due)

    def _arm(self, due: float) -> None:
        """Have the timer fire by ``due``. A timer already armed for no later is kept,
        and moved on when it fires: a keep-alive connection starts both clocks after
        every response, and a timer made and cancelled per response was a cost on every
        request."""
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return
            timer.cancel()
        self._timer_at = due
        self._timer = self.loop.call_at(due, self._late)

    def _stop_timer(self) -> None:
        self._header_due = self._idle_due = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self) -> None:
        """Close an idle connection whose keep-alive ran out, or one whose headers are
        late unless a request whose headers arrived is being answered (its response
        starts the clock again when it ends); else wait for the next due."""
        self._timer = None
        now = self.loop.time()
        idle_due, header_due = self._idle_due, self._header_due
        if idle_due is not None and now >= idle_due:
            if not self.transport.is_closing():
                self.transport.close()
            return
        if header_due is not None and now >= header_due:
            self._header_due = header_due = None
            answering = self.cycle is not None and not self.cycle.response_complete
            if not answering and not self.transport.is_closing():
                self.transport.close()
                return
        dues = [due for due in (idle_due, header_due) if due is not None]
        if dues:
            self._arm(min(dues))


def http_protocol(header_read_timeout_s: float) -> type[CoalescingProtocol]:
    """The protocol class for uvicorn's ``http``, with this header-read timeout."""
    assert header_read_timeout_s > 0
    return type(
        "QuorraHttpProtocol",
        (CoalescingProtocol,),
        {"header_read_timeout_s": header_read_timeout_s},
    )
