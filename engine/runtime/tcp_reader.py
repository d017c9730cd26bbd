"""Frames read from a socket into the buffers they are decoded from.

Rule: after its handshake, a connection's bytes go to a ``FrameReader``, an asyncio
buffered protocol put in place of the stream's: the socket writes into the reader's
buffers directly, with no stream buffer in between. A frame whose payload is at least
``DIRECT_FRAME_BYTES_MIN`` is read into a bytearray of its own, whole, and that
bytearray is handed on: its bytes are copied once, by the kernel. Smaller frames share
a scratch buffer and are cut out of it (a copy of a few bytes each, one read for many).
Frames are handed to ``on_frame`` in order; a header above the cap, or anything
``on_frame`` raises, ends the reading, as does the end of the connection: ``on_end`` is
told once, with the error or None.

A stream reader copied each payload three times on its way to the decoder (its read's
bytes, its buffer, the cut), about a quarter of a follower's loop in a replicated
publish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.limits import KIB
from engine.runtime.tcp_frames import HEADER_BYTES, frame_length

DIRECT_FRAME_BYTES_MIN = 64 * KIB
"""A frame with a payload this long is read into a buffer of its own."""
SCRATCH_BYTES = 256 * KIB
"""The shared buffer of smaller frames: room for one partial frame and a large read."""
assert SCRATCH_BYTES >= 2 * (HEADER_BYTES + DIRECT_FRAME_BYTES_MIN)


class FrameReader(asyncio.BufferedProtocol):
    """Cuts the connection's bytes into frame payloads (see the module's rule)."""

    def __init__(
        self,
        frame_bytes_max: int,
        on_frame: Callable[[bytes | bytearray], bool],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._on_frame = on_frame
        """Takes a payload; False once nothing more is to be read."""
        self._on_end = on_end
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        self._start = 0
        """The first byte in the scratch buffer not cut yet."""
        self._end = 0
        """The end of the bytes read into the scratch buffer."""
        self._frame: bytearray | None = None
        """A large frame's payload being read, if any, and how much of it is."""
        self._filled = 0
        self.ended = False

    # --- asyncio.BufferedProtocol ------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled :]
        if self._start and len(self._scratch) - self._end < HEADER_BYTES + DIRECT_FRAME_BYTES_MIN:
            # What is left is at most one small frame, partly read: move it to the front.
            kept = self._end - self._start
            self._scratch[:kept] = self._scratch[self._start : self._end]
            self._start, self._end = 0, kept
        return self._scratch[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.ended:
            self._start = self._end = 0  # after the end, what arrives is dropped
            return
        try:
            if self._frame is not None:
                self._filled += nbytes
                if self._filled == len(self._frame):
                    frame, self._frame = self._frame, None
                    if not self._on_frame(frame):
                        return
            else:
                self._end += nbytes
            self._cut()
        except Exception as e:
            self._finish(e)

    def eof_received(self) -> bool:
        return False  # the transport closes, then ``connection_lost``

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    # --- cutting -----------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes read before this reader took over the connection, in order."""
        view = memoryview(data)
        while view and not self.ended:
            buffer = self.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    def _cut(self) -> None:
        """Hand on every whole small frame in the scratch buffer; start reading a large
        one into a buffer of its own."""
        scratch = self._scratch
        while self._end - self._start >= HEADER_BYTES:
            start = self._start + HEADER_BYTES
            length = frame_length(scratch[self._start : start], self.frame_bytes_max)
            if length >= DIRECT_FRAME_BYTES_MIN:
                have = min(length, self._end - start)
                self._frame = bytearray(length)
                self._frame[:have] = scratch[start : start + have]
                self._filled = have
                self._start += HEADER_BYTES + have
                if have < length:
                    break
                frame, self._frame = self._frame, None
                if not self._on_frame(frame):
                    return
                continue
            if self._end - start < length:
                break
            self._start = start + length
            if not self._on_frame(bytes(scratch[start : self._start])):
                return
        if self._start == self._end:
            self._start = self._end = 0

    def _finish(self, error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self._frame = None
            self._on_end(error)


__all__ = ["DIRECT_FRAME_BYTES_MIN", "SCRATCH_BYTES", "FrameReader"]
