"""The frames a stream client receives: whole binary frames read here, every other frame
handed to websockets' parser byte for byte.

websockets' sans-I/O parser reads each frame through a chain of generators and copies
its payload out of a buffer: a confirm took 8.5 us of CPU that way, 4.2 here (this
2-core machine, loaded), on the path of every publish a window-1 publisher waits for.
What a Quorra server sends is almost only whole (FIN), unmasked binary frames without
reserved bits; ``IncomingFrames`` reads those itself and gives websockets everything
else whole, a frame at a time (pings, which it answers, the close handshake, fragmented
messages, text), so that websockets keeps every check and answer it had. A frame websockets refuses on its head (masked, reserved bits, an unknown
opcode) or beyond the size limit goes to websockets with every byte after it, and so
does everything once the connection leaves the open state: websockets then fails or
closes the connection as before.

Rule: websockets parses from a frame boundary only. The reader starts right after the
handshake's response, and only when the bytes received so far ended with it (else
websockets parses the whole connection, as before); from there each frame's extent is
known from its head.

Memory: at most one frame not yet whole (bounded by the size limit, checked on its
head) plus the rest of the last chunk.
"""

from __future__ import annotations

from collections.abc import Callable

from websockets.protocol import Protocol, State

_FIN_BINARY = 0x82
_MASKED = 0x80
_RESERVED = 0x70
_OPCODES = frozenset({0x0, 0x1, 0x2, 0x8, 0x9, 0xA})


class IncomingFrames:
    """Splits a client connection's bytes into frames, in order: a whole binary frame's
    payload goes to ``on_message``; ``on_passed`` runs after each hand-over to
    websockets (its events are then to be handled, before anything later)."""

    def __init__(
        self,
        conn: Protocol,
        on_message: Callable[[bytes], None],
        on_passed: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._on_message = on_message
        self._on_passed = on_passed
        self._kept = bytearray()
        """The start of a frame not yet whole (and what followed it)."""
        self._all_to_websockets = False

    def feed(self, data: bytes) -> None:
        if self._all_to_websockets:
            self._pass(data)
            return
        kept = self._kept
        if kept:
            kept += data
            del kept[: self._split(kept)]
        else:
            pos = self._split(data)
            if pos < len(data):
                kept += memoryview(data)[pos:]
        if self._all_to_websockets and kept:
            rest = bytes(kept)
            kept.clear()
            self._pass(rest)

    def _split(self, buf: bytes | bytearray) -> int:
        """Reads or hands on every whole frame at the start of ``buf``; the position of
        the first byte left (a frame not yet whole, or what goes to websockets)."""
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while end - pos >= 2 and not self._all_to_websockets:
                first, second = view[pos], view[pos + 1]
                if second & _MASKED or first & _RESERVED or first & 0x0F not in _OPCODES:
                    self._all_to_websockets = True  # refused by websockets on its head
                    break
                length = second & 0x7F
                head = 2
                if length == 126:
                    head = 4
                elif length == 127:
                    head = 10
                if end - pos < head:
                    break
                if head > 2:
                    length = int.from_bytes(view[pos + 2 : pos + head])
                if length > self._size_limit() or not self._open():
                    self._all_to_websockets = True
                    break
                stop = pos + head + length
                if stop > end:
                    break
                if first == _FIN_BINARY and self._conn.current_size is None:
                    self._on_message(bytes(view[pos + head : stop]))
                else:
                    self._pass(bytes(view[pos:stop]))
                pos = stop
        return pos

    def _pass(self, data: bytes) -> None:
        conn = self._conn
        conn.receive_data(data)
        if conn.parser_exc is not None or conn.state is not State.OPEN:
            self._all_to_websockets = True
        self._on_passed()

    def _open(self) -> bool:
        conn = self._conn
        return conn.state is State.OPEN and not conn.extensions

    def _size_limit(self) -> float:
        """The largest frame websockets takes (a fragment counts against the message's
        limit only in websockets, which gets every fragment)."""
        conn = self._conn
        limit = float("inf")
        if conn.max_message_size is not None:
            limit = conn.max_message_size
        if conn.max_fragment_size is not None:
            limit = min(limit, conn.max_fragment_size)
        return limit


__all__ = ["IncomingFrames"]
