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
"""

from __future__ import annotations

import struct
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from app.deliver_frames import FrameChunks

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
    ``FrameChunks`` as its chunks)."""

    async def send(self, message: Any) -> None:
        data = message.get("bytes") if message["type"] == "websocket.send" else None
        if data is not None and self._sends_direct():
            await self.writable.wait()  # the transport's high-water mark, as uvicorn waits
            if self._sends_direct():
                queued = self.conn.data_to_send()
                if type(data) is FrameChunks:
                    head = binary_frame_head(data.size)
                    self.transport.writelines([*queued, head, *data.chunks])
                    return
                size = data.nbytes if isinstance(data, memoryview) else len(data)
                self.transport.writelines([*queued, binary_frame_head(size), data])
                return
        if type(data) is FrameChunks:
            message = {**message, "bytes": data.joined()}
        await super().send(message)

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


__all__ = ["DirectFrameProtocol", "binary_frame_head"]
