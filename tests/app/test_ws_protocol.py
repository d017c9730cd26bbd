"""The stream's WebSocket protocol writes a binary frame as websockets would serialize
it (the same head for every length class, the payload unchanged), and reads incoming
frames as websockets' own parser does (the same messages, events, answers and errors)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State
from websockets.speedups import apply_mask

from app.ws_protocol import binary_frame_head
from quorra.ws_frames import IncomingFrames

LENGTHS = st.sampled_from([0, 1, 125, 126, 127, 65_535, 65_536, 1 << 20]) | st.integers(0, 70_000)


@given(LENGTHS)
def test_a_binary_frame_is_what_websockets_serializes(length: int) -> None:
    payload = bytes(length)
    expected = Frame(Opcode.BINARY, payload).serialize(mask=False)
    assert binary_frame_head(length) + payload == expected


# Incoming frames: IncomingFrames (whole binary frames read itself, the rest handed to
# websockets) against websockets' parser alone, on the same bytes cut the same way.

MAX_SIZE = 300
PAYLOADS = st.sampled_from([0, 1, 125, 126, MAX_SIZE]) | st.integers(0, 200)


def wire(
    opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, key: bytes | None, width: str
) -> bytes:
    """A frame on the wire, as a client may send it (masked when it has a ``key``), its
    length in the ``width`` asked for when it fits."""
    length = len(payload)
    mask_bit = 0x80 if key is not None else 0
    if width == "64" or length >= 1 << 16:
        head = bytes([127 | mask_bit]) + length.to_bytes(8)
    elif width == "16" or length >= 126:
        head = bytes([126 | mask_bit]) + length.to_bytes(2)
    else:
        head = bytes([length | mask_bit])
    first = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    if key is None:
        return first + head + payload
    return first + head + key + apply_mask(payload, key)


@st.composite
def frame_of(draw: st.DrawFn, opcode: int, fin: bool = True, size: int | None = None) -> bytes:
    n = draw(PAYLOADS) if size is None else size
    payload = draw(st.binary(min_size=n, max_size=n))
    key = draw(st.binary(min_size=4, max_size=4))
    width = draw(st.sampled_from(["7", "16", "64"]))
    return wire(opcode, payload, fin=fin, key=key, width=width)


CONTROL = st.sampled_from([0x9, 0xA]).flatmap(lambda op: frame_of(op, size=3))


@st.composite
def fragmented(draw: st.DrawFn) -> bytes:
    """A message in fragments (text or binary), control frames between them."""
    opcode = draw(st.sampled_from([0x1, 0x2]))
    parts = [draw(frame_of(opcode, fin=False))]
    for _ in range(draw(st.integers(0, 2))):
        parts += draw(st.lists(CONTROL, max_size=1))
        parts.append(draw(frame_of(0x0, fin=False)))
    parts += draw(st.lists(CONTROL, max_size=1))
    parts.append(draw(frame_of(0x0)))
    return b"".join(parts)


@st.composite
def ending(draw: st.DrawFn) -> bytes:
    """A last frame websockets refuses or ends the connection on."""
    kinds = ["rsv", "unmasked", "opcode", "big", "cont", "close", "partial", "interrupted"]
    kind = draw(st.sampled_from(kinds))
    if kind == "rsv":
        payload = draw(st.binary(max_size=20))
        key = draw(st.binary(min_size=4, max_size=4))
        return wire(0x2, payload, rsv=draw(st.sampled_from([1, 2, 4])), key=key, width="7")
    if kind == "unmasked":
        return wire(0x2, draw(st.binary(max_size=20)), key=None, width="7")
    if kind == "opcode":
        return draw(frame_of(draw(st.sampled_from([0x3, 0xB])), size=2))
    if kind == "big":
        return draw(frame_of(draw(st.sampled_from([0x1, 0x2])), size=MAX_SIZE + 1))
    if kind == "cont":
        return draw(frame_of(0x0))
    if kind == "interrupted":  # a new message before the fragmented one ended
        return draw(frame_of(0x2, fin=False)) + draw(frame_of(0x2))
    if kind == "partial":
        return draw(frame_of(0x2))[: draw(st.integers(1, 8))]
    reason = draw(st.sampled_from([b"", (1000).to_bytes(2) + b"bye", b"\x03", b"\x0b\xb8"]))
    key = draw(st.binary(min_size=4, max_size=4))
    return wire(0x8, reason, key=key, width="7")


STREAMS = st.tuples(
    st.lists(frame_of(0x2) | frame_of(0x2) | frame_of(0x1) | CONTROL | fragmented(), max_size=8),
    st.lists(ending(), max_size=1),
    st.lists(frame_of(0x2), max_size=2),
).map(lambda parts: b"".join(b"".join(p) for p in parts))
"""Frames a client sends: whole binary and text ones, control frames and fragmented
messages, then perhaps one websockets ends the connection on, then more."""


def _server() -> Protocol:
    return Protocol(Side.SERVER, state=State.OPEN, max_size=MAX_SIZE)


def _outcome(conn: Protocol, events: list[tuple[int, bool, bytes]]) -> dict[str, object]:
    close = conn.close_sent
    return {
        "events": events,
        "state": conn.state,
        "error": None if conn.parser_exc is None else repr(conn.parser_exc),
        "close": None if close is None else (close.code, close.reason),
        "sent": b"".join(conn.data_to_send()),
    }


def _as_tuple(frame: object) -> tuple[int, bool, bytes]:
    assert isinstance(frame, Frame)
    return (int(frame.opcode), frame.fin, bytes(frame.data))


@settings(max_examples=300)
@given(STREAMS, st.data())
def test_incoming_frames_read_as_websockets_reads_them(stream: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    alone = _server()
    expected: list[tuple[int, bool, bytes]] = []
    for chunk in chunks:
        alone.receive_data(chunk)
        expected.extend(_as_tuple(e) for e in alone.events_received())

    conn = _server()
    got: list[tuple[int, bool, bytes]] = []
    incoming = IncomingFrames(
        conn,
        on_message=lambda payload: got.append((int(Opcode.BINARY), True, payload)),
        on_passed=lambda: got.extend(_as_tuple(e) for e in conn.events_received()),
    )
    for chunk in chunks:
        incoming.feed(chunk)

    assert _outcome(conn, got) == _outcome(alone, expected)


def test_whole_binary_frames_are_read_without_websockets() -> None:
    conn = Protocol(Side.SERVER, state=State.OPEN, max_size=1 << 20)
    got: list[bytes] = []
    incoming = IncomingFrames(conn, got.append, lambda: pytest.fail("handed to websockets"))
    payload = bytes(range(256)) * 400
    frame = Frame(Opcode.BINARY, payload).serialize(mask=True)
    wire = frame * 3
    for a, b in [(0, 5), (5, len(frame) + 7), (len(frame) + 7, len(wire))]:
        incoming.feed(wire[a:b])
    assert got == [payload] * 3
