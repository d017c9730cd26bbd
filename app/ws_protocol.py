"""The WebSocket protocol uvicorn runs for streams: websockets' sans-I/O one (uvicorn's
``websockets-sansio``), with each binary frame written to the transport as it is.

uvicorn hands a binary message to websockets, which serializes the frame into a
``BytesIO`` (its head, then the payload copied in, the buffer grown as it goes) and
copies it out again; a ``deliver`` frame is a MiB and more, and under the server's 64
KiB mmap threshold (``app/server.py`` ``tune_malloc``) every such buffer is a fresh
mapping whose pages fault in: 2.3 us per message of a frame of a thousand 1 KiB
messages on this machine (0.13 under glibc's defaults). A server's frame is never
masked, and the stream negotiates no extension (no compression: ``websocket_options``),
so a binary frame is a head of 2 to 10 bytes and the payload unchanged: ``send`` writes
the two with ``writelines`` (one ``writev`` under uvloop; a payload the socket does not
take at once is kept by the transport, not copied), after anything websockets had
queued, so frames leave in order. The payload may be any bytes-like object, or a
``FrameChunks`` (``app/deliver_frames.py``: a ``deliver`` frame as chunks around its
message bodies), whose chunks follow the head in the same ``writelines``; uvloop keeps
references to what the socket does not take at once, which is why the chunks are
``bytes``. Everything else, and a binary frame on a connection that is not open or uses
an extension, takes uvicorn's path (chunks joined first).

Incoming: once the handshake request has been parsed, and nothing came after it yet
(websockets' frame parser then starts at a frame boundary), the connection's bytes go
through ``IncomingFrames`` (``quorra/ws_frames.py``), which reads whole binary frames
itself and hands websockets every other frame whole; its events are handled as uvicorn
handles them, in arrival order. A client that sends frames before the handshake's end
keeps websockets' parser for the whole connection.

An endpoint may take whole binary frames in the callback that read them (``TAKE_NOW``:
it sets a ``take(payload) -> bool``): a frame it takes never goes through the ASGI
``receive`` (its queue, the reading paused and resumed around each message, the wake-up
of the endpoint's reader task); one it declines, and any frame while others wait in
that queue, is queued as uvicorn queues it, so frames reach the endpoint in order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request
from websockets.protocol import State

from app.deliver_frames import FrameChunks
from quorra.ws_frames import IncomingFrames

_HEAD_END = b"\r\n\r\n"
SEND_NOW = "quorra.websocket.send_now"
"""The ASGI scope extension (``scope["extensions"]``) holding ``send_now``: an endpoint
that must answer within the current loop turn (a stream's confirm, from the apply)."""

TAKE_NOW = "quorra.websocket.take_now"
"""The ASGI scope extension holding a setter of the endpoint's ``take`` (None: no
more): a whole binary frame it returns True for is its own, handled there and then."""

_FIN_BINARY = 0x82
"""The first byte of a whole (FIN) binary frame."""
_SHORT = struct.Struct("!BB")
_MEDIUM = struct.Struct("!BBH")
_LONG = struct.Struct("!BBQ")


def binary_frame_head(length: int) -> bytes:
    """The head of an unmasked, whole binary frame of ``length`` payload bytes (RFC 6455
    section 5.2: 7-bit, 16-bit or 64-bit length)."""
    assert 0 <= length < 1 << 63
    if length < 126:
        return _SHORT.pack(_FIN_BINARY, length)
    if length < 1 << 16:
        return _MEDIUM.pack(_FIN_BINARY, 126, length)
    return _LONG.pack(_FIN_BINARY, 127, length)


class DirectFrameProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, binary frames written without a copy (a
    ``FrameChunks`` as its chunks) and whole incoming binary frames read by
    ``IncomingFrames``."""

    _incoming: IncomingFrames | None = None
    _request_parsed = False
    _failure_answered = False
    _handshake_bytes: bytearray | None = None
    """What came before the handshake request was parsed (bounded by websockets' own
    limits on a request's lines and headers, the request itself refused past them)."""
    _take: Callable[[bytes], bool] | None = None

    def data_received(self, data: bytes) -> None:
        if self._incoming is None:
            self._before_frames(data)
        else:
            self._incoming.feed(data)

    def _message(self, payload: bytes) -> None:
        """A whole binary frame read by ``IncomingFrames``: the endpoint's if it takes it
        and nothing is queued before it, else as uvicorn's ``handle_bytes``."""
        take = self._take
        if take is not None and not self.close_sent and self.queue.empty() and take(payload):
            return
        self.curr_msg_data_type = "bytes"
        self.frames = [payload]
        self.send_receive_event_to_app()

    def _passed(self) -> None:
        """After bytes handed to websockets: as uvicorn's ``data_received`` after its
        ``receive_data`` (a failure answered once)."""
        if self.conn.parser_exc is not None:
            if not self._failure_answered:
                self._failure_answered = True
                self.handle_parser_exception()
            return
        self.handle_events()

    def _before_frames(self, data: bytes) -> None:
        """uvicorn's path until the request is parsed; then ``IncomingFrames`` if the
        request ended the bytes received (nothing of a frame parsed by websockets)."""
        if self._request_parsed or self.close_sent:
            super().data_received(data)
            return
        seen = self._handshake_bytes
        if seen is None:
            seen = self._handshake_bytes = bytearray()
        seen += data
        super().data_received(data)
        if not self._request_parsed:
            return
        self._handshake_bytes = None
        whole = seen.find(_HEAD_END) + len(_HEAD_END) == len(seen)
        if whole and self.conn.parser_exc is None and not self.close_sent:
            self._incoming = IncomingFrames(self.conn, self._message, self._passed)

    def handle_connect(self, event: Request) -> None:
        self._request_parsed = True
        super().handle_connect(event)
        self.scope["extensions"][SEND_NOW] = self.send_now  # type: ignore[assignment]
        self.scope["extensions"][TAKE_NOW] = self.take_now  # type: ignore[assignment]

    def take_now(self, take: Callable[[bytes], bool] | None) -> None:
        """Set (or, with None, remove) the endpoint's taker of whole binary frames."""
        self._take = take

    def send_now(self, payload: bytes) -> bool:
        """Write a binary frame in this turn of the loop, without the ASGI ``send``'s
        await; False (nothing written) unless ``send`` would write it straight away: the
        connection open and the transport below its high-water mark. Writes go to the
        transport in call order, so a frame written here leaves after every frame sent
        before it."""
        if not (self.writable.is_set() and self._sends_direct()):
            return False
        self._write_binary(payload, len(payload))
        return True

    async def send(self, message: Any) -> None:
        data = message.get("bytes") if message["type"] == "websocket.send" else None
        if data is not None and self._sends_direct():
            await self.writable.wait()  # the transport's high-water mark, as uvicorn waits
            if self._sends_direct():
                if type(data) is FrameChunks:
                    queued = self.conn.data_to_send()
                    head = binary_frame_head(data.size)
                    self.transport.writelines([*queued, head, *data.chunks])
                    return
                self._write_binary(data, data.nbytes if isinstance(data, memoryview) else len(data))
                return
        if type(data) is FrameChunks:
            message = {**message, "bytes": data.joined()}
        await super().send(message)

    def _write_binary(self, payload: bytes | memoryview, size: int) -> None:
        """A whole binary frame of ``payload`` after what websockets queued (a pong, say)."""
        self.transport.writelines([*self.conn.data_to_send(), binary_frame_head(size), payload])

    def _sends_direct(self) -> bool:
        """Whether a data frame may go straight out: the connection open (uvicorn's
        checks, then websockets' own state), nothing negotiated that rewrites frames."""
        return (
            self.handshake_complete
            and not self.disconnected
            and not self.close_sent
            and self.initial_response is None
            and self.conn.state is State.OPEN
            and not self.conn.extensions
            and not self.conn.expect_continuation_frame
        )


__all__ = ["SEND_NOW", "TAKE_NOW", "DirectFrameProtocol", "binary_frame_head"]
