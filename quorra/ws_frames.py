"""Incoming WebSocket frames, on either side of a stream: whole binary frames parsed
here, everything else by websockets' own parser.

websockets' sans-I/O parser (``Protocol.receive_data``) reads a frame through
generators, copying its payload out of its buffer (a ``bytearray`` slice, then the
unmasked copy). On the server, a publish frame of 100 KiB passed through it as several
copies and a dozen generator steps, ~12% of a stream publish's server time in a
profile; in the client, a confirm took 8.5 us of CPU that way and 4.2 here (this 2-core
machine, loaded), on the path of every publish a window-1 publisher waits for. Most
frames are one kind: a whole (FIN) binary frame, no reserved bits, within the size
limit, on an open connection without extensions, masked when a client sent it (the
server reads them) and unmasked when a server did (the client reads them: the side of
``conn`` says which). ``IncomingFrames`` reads those itself, a masked one unmasked once
(websockets' C ``apply_mask``) straight out of the received chunk when the frame lies
whole in it, or out of its chunks' pieces joined once (a 100 KiB frame read in 64 KiB
chunks: ~40 us instead of ~145 on this machine). It hands websockets every other frame
byte for byte, so that websockets keeps every check and answer it had: control frames
(ping answered with pong, close handshake and codes), text frames, fragmented messages,
frames masked the wrong way (1002), oversized ones (1009), reserved bits and bad opcodes
(1002).

Rule: websockets parses from a frame boundary only. A frame's extent is known from its
head alone (2 to 14 bytes), so the reader splits the stream at frame boundaries and
feeds websockets the bytes of each frame it does not read itself, as they arrive; a
frame websockets refuses on its first two bytes (masked the wrong way, unknown opcode)
is handed over at once, with everything after it. Once websockets fails the connection,
or its state leaves OPEN for closing, every later byte goes to websockets, which
discards or parses it as before. The reader is made where a frame starts: on the server
once the request is parsed, in the client once the handshake's response is, and only
when nothing of a frame came with it.

Memory: the reader keeps at most one frame it reads itself (bounded by the size limit,
checked on the head before the payload is kept) plus the rest of the last chunk.
"""

from __future__ import annotations

from collections.abc import Callable

from websockets.protocol import Protocol, Side, State

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the C extension ships in websockets' wheels
    from websockets.utils import apply_mask

_FIN_BINARY = 0x82
"""A whole binary frame's first byte: FIN, no reserved bits, opcode 2."""
_MASKED = 0x80
_LENGTH_16 = 126
_LENGTH_64 = 127
_MASK_BYTES = 4
_OPCODES = frozenset({0x0, 0x1, 0x2, 0x8, 0x9, 0xA})
_REFUSED = -1


class IncomingFrames:
    """Splits a connection's incoming bytes into frames, in arrival order: the payload of
    each whole binary frame read here goes to ``on_message``; ``on_passed`` runs after
    each hand-over to websockets (its events and ``parser_exc`` are then to be handled,
    before anything later)."""

    def __init__(
        self,
        conn: Protocol,
        on_message: Callable[[bytes], None],
        on_passed: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._masked = conn.side is Side.SERVER
        """Whether the frames come masked: a client masks what it sends, a server not."""
        self._on_message = on_message
        self._on_passed = on_passed
        self._kept = bytearray()
        """The bytes of an incomplete head (and what followed it in its chunk)."""
        self._pieces: list[bytes | memoryview] = []
        """A frame read here whose head came and whose payload is still coming: its bytes
        so far, the received chunks' own (joined once, when whole: a ``bytearray`` grown
        chunk by chunk costs several copies and fresh pages, ~100 us a 100 KiB frame)."""
        self._pieces_left = 0
        self._pass_left = 0
        """Bytes of the current frame still to hand to websockets."""
        self._all_to_websockets = False

    def feed(self, data: bytes) -> None:
        if self._all_to_websockets:
            self._pass(data)
            return
        rest: bytes | memoryview = data
        if self._pieces_left:
            n = min(self._pieces_left, len(data))
            self._pieces.append(memoryview(data)[:n])
            self._pieces_left -= n
            if self._pieces_left:
                return
            whole = b"".join(self._pieces)
            self._pieces = []
            done = self._split(whole)
            assert done == len(whole)  # nothing passed to websockets since its head came
            rest = memoryview(data)[n:]
        kept = self._kept
        if kept:
            kept += rest
            pos = self._split(kept)
            if self._pieces_left:
                self._pieces = [bytes(kept[pos:])]
                kept.clear()
            else:
                del kept[:pos]
        else:
            pos = self._split(rest)
            if self._pieces_left:
                self._pieces = [memoryview(rest)[pos:]]
            elif pos < len(rest):
                kept += memoryview(rest)[pos:]
        if self._all_to_websockets and kept:
            left = bytes(kept)
            kept.clear()
            self._pass(left)

    def _split(self, buf: bytes | bytearray | memoryview) -> int:
        """Reads or hands on every frame that begins in ``buf``; the position of the first
        byte left for later (an incomplete head, or a frame read here not yet whole)."""
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while pos < end and not self._all_to_websockets:
                if self._pass_left:
                    n = min(self._pass_left, end - pos)
                    self._pass_left -= n
                    self._pass(bytes(view[pos : pos + n]))
                    pos += n
                    continue
                head = _head(view, pos, end, self._masked)
                if head is None:
                    break
                first, head_bytes, length = head
                if length == _REFUSED:
                    self._all_to_websockets = True
                    break
                if first == _FIN_BINARY and length <= self._size_limit() and self._open():
                    start = pos + head_bytes
                    if end - start < length:
                        self._pieces_left = start + length - end
                        break
                    payload = view[start : start + length]
                    if self._masked:
                        mask = bytes(view[start - _MASK_BYTES : start])
                        self._on_message(apply_mask(payload, mask))
                    else:
                        self._on_message(bytes(payload))
                    pos = start + length
                else:
                    self._pass_left = head_bytes + length
        return pos

    def _pass(self, data: bytes) -> None:
        conn = self._conn
        conn.receive_data(data)
        if conn.parser_exc is not None or conn.state in (State.CLOSING, State.CLOSED):
            self._all_to_websockets = True
        self._on_passed()

    def _open(self) -> bool:
        """Whether websockets would take a whole binary frame as a message of its own and
        nothing else: open, no fragmented message under way, no extension."""
        conn = self._conn
        return conn.state is State.OPEN and conn.current_size is None and not conn.extensions

    def _size_limit(self) -> float:
        """The largest payload websockets takes for a new message's first frame."""
        conn = self._conn
        limit = float("inf")
        if conn.max_message_size is not None:
            limit = conn.max_message_size
        if conn.max_fragment_size is not None:
            limit = min(limit, conn.max_fragment_size)
        return limit


def _head(view: memoryview, pos: int, end: int, masked: bool) -> tuple[int, int, int] | None:
    """A frame head at ``pos``: its first byte, its head bytes (with the mask key of a
    ``masked`` frame) and its payload length; None while the length is incomplete.
    ``_REFUSED`` as length for a frame websockets refuses on its first two bytes (masked
    the wrong way for this side, or an unknown opcode)."""
    if end - pos < 2:
        return None
    first = view[pos]
    second = view[pos + 1]
    if bool(second & _MASKED) is not masked or first & 0x0F not in _OPCODES:
        return first, 2, _REFUSED
    key = _MASK_BYTES if masked else 0
    length = second & 0x7F
    if length == _LENGTH_16:
        if end - pos < 4:
            return None
        return first, 4 + key, int.from_bytes(view[pos + 2 : pos + 4])
    if length == _LENGTH_64:
        if end - pos < 10:
            return None
        return first, 10 + key, int.from_bytes(view[pos + 2 : pos + 10])
    return first, 2 + key, length


__all__ = ["IncomingFrames"]
