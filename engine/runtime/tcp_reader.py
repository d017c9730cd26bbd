"""Frames read from a socket into the buffers they are decoded from.

Rule: after its handshake, a connection's bytes go to a ``FrameReader``, an asyncio
buffered protocol put in place of the stream's: the socket writes into the reader's own
buffers, and each frame is handed on as a view of the buffer it was read into, valid
during the call only (the decoder keeps nothing of it). Reads go to a scratch buffer,
where every frame that arrived whole is decoded in place, however large. A frame that
did not, of at least ``DIRECT_FRAME_BYTES_MIN``, moves to a buffer of its own (kept for
the next, up to ``LARGE_BUFFER_KEPT_BYTES_MAX``) and the socket writes the rest of it
there; a smaller one waits in the scratch buffer for its rest. Frames are handed to
``on_frame`` in order; a header above the cap, or anything ``on_frame`` raises, ends the
reading, as does the end of the connection: ``on_end`` is told once, with the error or
None.

A stream reader copied each payload three times on its way to the decoder (its read's
bytes, its buffer, the cut), about a quarter of a follower's loop in a replicated
publish; a fresh bytearray per large frame cost a tenth (zeroed, then page-faulted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.limits import KIB, MIB
from engine.runtime.tcp_frames import HEADER_BYTES, frame_length

DIRECT_FRAME_BYTES_MIN = 64 * KIB
"""A frame with a payload this long that did not arrive whole in the scratch buffer is
read into a buffer of its own."""
SCRATCH_BYTES = 256 * KIB
"""The buffer reads go to: room for one partial smaller frame and a large read."""
LARGE_BUFFER_KEPT_BYTES_MAX = 4 * MIB
"""The buffer of a larger frame is kept for the next one up to this size; beyond, each
such frame gets a buffer of its own (rare: an append is at most a few entries)."""
assert SCRATCH_BYTES >= 2 * (HEADER_BYTES + DIRECT_FRAME_BYTES_MIN)


class FrameReader(asyncio.BufferedProtocol):
    """Cuts the connection's bytes into frame payloads (see the module's rule)."""

    def __init__(
        self,
        frame_bytes_max: int,
        on_frame: Callable[[memoryview], bool],
        on_end: Callable[[BaseException | None], None],
    ) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._on_frame = on_frame
        """Takes a payload, a view valid during the call; False once nothing more is to
        be read."""
        self._on_end = on_end
        self._scratch = memoryview(bytearray(SCRATCH_BYTES))
        self._start = 0
        """The first byte in the scratch buffer not cut yet."""
        self._end = 0
        """The end of the bytes read into the scratch buffer."""
        self._large = memoryview(bytearray(0))
        """The kept buffer of larger frames."""
        self._frame: memoryview | None = None
        """A larger frame's payload being read, if any, and how much of it is."""
        self._filled = 0
        self.ended = False

    # --- asyncio.BufferedProtocol ------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return self._frame[self._filled :]
        if self._start and len(self._scratch) - self._end < HEADER_BYTES + DIRECT_FRAME_BYTES_MIN:
            # What is left is at most one smaller frame, partly read: move it to the front.
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
        """Hand on every whole frame in the scratch buffer; move a larger partial one to
        a buffer of its own."""
        scratch = self._scratch
        while self._end - self._start >= HEADER_BYTES:
            start = self._start + HEADER_BYTES
            length = frame_length(scratch[self._start : start], self.frame_bytes_max)
            have = self._end - start
            if have >= length:
                self._start = start + length
                if not self._on_frame(scratch[start : self._start]):
                    return
                continue
            if length >= DIRECT_FRAME_BYTES_MIN:
                self._frame = self._buffer_of(length)
                self._frame[:have] = scratch[start : self._end]
                self._filled = have
                self._start = self._end
            break
        if self._start == self._end:
            self._start = self._end = 0

    def _buffer_of(self, length: int) -> memoryview:
        if length > LARGE_BUFFER_KEPT_BYTES_MAX:
            return memoryview(bytearray(length))
        if len(self._large) < length:
            self._large = memoryview(bytearray(length))
        return self._large[:length]

    def _finish(self, error: BaseException | None) -> None:
        if not self.ended:
            self.ended = True
            self._frame = None
            self._on_end(error)


__all__ = ["DIRECT_FRAME_BYTES_MIN", "LARGE_BUFFER_KEPT_BYTES_MAX", "SCRATCH_BYTES", "FrameReader"]
