"""The WebSocket under ``AsyncStream``: websockets' sans-I/O client protocol (handshake,
framing, masking, ping answers, size limit, close handshake) on an ``asyncio.Protocol``,
each whole message handed to ``on_message`` in the callback that read it.

Why not websockets' asyncio connection: it reads through a task of its own and a message
assembler, and each ``send`` takes a lock and waits for the write buffer to drain; a
confirm then woke the connection's reader, the stream's reader and the caller, one loop
turn each (a window-1 publish spent ~240 us of client CPU a message on this machine).
Here a frame is parsed and handed on where it arrives and a ``send`` writes at once,
awaiting only when the transport is above its high-water mark (back-pressure).

Rule: everything websockets decides stays its own (``ClientProtocol``); this module only
moves bytes between it and the socket, in order, after every event it is given. Two
exceptions, for the frames that are most of the traffic: a binary message on an open
connection without extensions is written here as websockets would frame it
(``_masked_binary_frame``), and the whole binary frames the server sends after the
handshake are read by ``IncomingFrames`` (``quorra/ws_frames.py``, the server's reader
too), which hands websockets every other frame whole.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import struct
from collections.abc import Callable, Mapping
from typing import cast

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from quorra.ws_frames import IncomingFrames

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C extension ships in websockets' wheels
    from websockets.utils import apply_mask

CLOSE_TIMEOUT_S = 10.0
"""How long ``close`` waits for the server's side of the close handshake."""

_HEAD_END = b"\r\n\r\n"
_FIN_BINARY = 0x82
_MASKED = 0x80
_SHORT = struct.Struct("!BB")
_MEDIUM = struct.Struct("!BBH")
_LONG = struct.Struct("!BBQ")


class ClientWebSocket(asyncio.Protocol):
    """One client connection; ``await connect(...)`` opens it."""

    def __init__(self, protocol: ClientProtocol, on_message: Callable[[bytes], None]) -> None:
        self._ws = protocol
        self._on_message = on_message
        self._transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self._opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        """Done once the TCP connection is gone."""
        self._writable = asyncio.Event()
        self._writable.set()
        self._fragments: list[bytes] = []
        self._handshake_bytes: bytearray | None = bytearray()
        """What came until the handshake's response was parsed (bounded by websockets'
        limits on a response)."""
        self._incoming: IncomingFrames | None = None
        """A fragmented message's frames so far (websockets bounds them by ``max_size``)."""

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no subclasses of asyncio's, only alike
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        incoming = self._incoming
        if incoming is not None:
            incoming.feed(data)
            return
        seen = self._handshake_bytes
        if seen is not None:
            seen += data
        self._ws.receive_data(data)
        self._handle_events()
        if seen is not None and self._opened.done():
            self._handshake_bytes = None
            # The frames after the handshake are read by ``IncomingFrames`` if nothing
            # of them came yet (websockets' parser then starts at a frame boundary).
            whole = seen.find(_HEAD_END) + len(_HEAD_END) == len(seen)
            if whole and self._opened.exception() is None and self._ws.state is State.OPEN:
                self._incoming = IncomingFrames(self._ws, self._on_message, self._handle_events)

    def eof_received(self) -> None:
        # An answer to the handshake without a length ends with the stream (its body).
        self._ws.receive_eof()
        self._handle_events()

    def _handle_events(self) -> None:
        ws = self._ws
        self._flush()
        for event in ws.events_received():
            if isinstance(event, Response):
                if not self._opened.done():
                    if ws.handshake_exc is not None:
                        self._opened.set_exception(ws.handshake_exc)
                    else:
                        self._opened.set_result(None)
            elif isinstance(event, Frame):
                self._on_frame(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        if not self._opened.done():
            self._opened.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- the connection -------------------------------------------------------------------

    def _on_frame(self, frame: Frame) -> None:
        if frame.opcode in (Opcode.PING, Opcode.PONG, Opcode.CLOSE):
            return  # answered by websockets (pong, close reply), flushed already
        if frame.fin and not self._fragments:
            self._on_message(bytes(frame.data))
            return
        self._fragments.append(bytes(frame.data))
        if frame.fin:
            whole = b"".join(self._fragments)
            self._fragments = []
            self._on_message(whole)

    def _flush(self) -> None:
        """Write what websockets has to send; an empty chunk is the end of what it sends
        (the server then closes the TCP connection, RFC 6455 section 7.1.1)."""
        transport = self._transport
        assert transport is not None
        chunks = self._ws.data_to_send()
        if not chunks:
            return
        if chunks[-1] == b"":
            transport.writelines(chunks[:-1])
            if transport.can_write_eof() and not transport.is_closing():
                transport.write_eof()
        else:
            transport.writelines(chunks)

    def close_error(self) -> ConnectionClosed:
        """Why the connection closed (websockets' view; a connection lost without a close
        frame or an end of stream is a ``ConnectionClosedError`` without codes)."""
        if self._ws.state is not State.CLOSED:
            return ConnectionClosedError(None, None)
        return self._ws.close_exc

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def send(self, data: bytes) -> None:
        """Send one binary message; ``ConnectionClosed`` once the connection is closing."""
        ws = self._ws
        if ws.state is not State.OPEN or self.closed.done():
            raise self.close_error()
        if ws.extensions or ws.expect_continuation_frame:
            ws.send_binary(data)
            self._flush()
        else:
            self._flush()  # what websockets queued (a pong) goes first
            transport = self._transport
            assert transport is not None
            transport.writelines(_masked_binary_frame(data))
        if not self._writable.is_set():
            await self._writable.wait()

    async def close(self) -> None:
        """The close handshake (code 1000), then the socket closed; waits at most
        ``CLOSE_TIMEOUT_S`` for the server's side."""
        if self._ws.state is State.OPEN:
            self._ws.send_close(1000)
            self._flush()
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), CLOSE_TIMEOUT_S)
        except TimeoutError:
            pass
        finally:
            if self._transport is not None:
                self._transport.close()


def _masked_binary_frame(data: bytes) -> list[bytes]:
    """A whole binary frame of ``data`` as a client sends it (RFC 6455 section 5.2): the
    head with a fresh random mask key, then the payload masked (websockets' C
    ``apply_mask``). What websockets' ``send_binary`` writes for an open connection
    without extensions, without its frame object, checks and buffer: 4.5 us a publish
    frame of one 1 KiB message instead of 6.7 on this machine, loaded."""
    length = len(data)
    if length < 126:
        head = _SHORT.pack(_FIN_BINARY, _MASKED | length)
    elif length < 1 << 16:
        head = _MEDIUM.pack(_FIN_BINARY, _MASKED | 126, length)
    else:
        head = _LONG.pack(_FIN_BINARY, _MASKED | 127, length)
    mask = os.urandom(4)  # as websockets' (secrets.token_bytes): the OS's random source
    return [head + mask, apply_mask(data, mask)]


async def connect(
    url: str,
    headers: Mapping[str, str],
    *,
    on_message: Callable[[bytes], None],
    open_timeout_s: float,
    max_size: int,
) -> ClientWebSocket:
    """A connection whose handshake succeeded; websockets' ``InvalidStatus`` (with the
    server's answer) when the server refused it, ``TimeoutError`` past ``open_timeout_s``."""
    uri = parse_uri(url)
    protocol = ClientProtocol(uri, max_size=max_size)
    loop = asyncio.get_running_loop()
    conn = ClientWebSocket(protocol, on_message)
    context = ssl.create_default_context() if uri.secure else None
    async with asyncio.timeout(open_timeout_s):
        await loop.create_connection(lambda: conn, uri.host, uri.port, ssl=context)
        try:
            request = protocol.connect()
            for name, value in headers.items():
                request.headers[name] = value
            protocol.send_request(request)
            conn._flush()
            await conn._opened
        except BaseException:
            if conn._transport is not None:
                conn._transport.close()
            raise
    return conn


__all__ = ["ClientWebSocket", "connect"]
