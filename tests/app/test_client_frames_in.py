"""The stream client's reader of incoming frames (``quorra/ws_frames.py``, on the client
side) against websockets' own parser: whatever a server sends and however TCP cuts it, the messages
are the same, in the same order, and a frame websockets refuses still fails the
connection as websockets fails it."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from quorra.ws_frames import IncomingFrames

LIMIT = 4096
URI = parse_uri("ws://127.0.0.1/s")


def _client() -> ClientProtocol:
    return ClientProtocol(URI, state=State.OPEN, max_size=LIMIT)


def _server_frames(kind: str, payload: bytes) -> list[Frame]:
    if kind == "binary":
        return [Frame(Opcode.BINARY, payload)]
    if kind == "text":
        return [Frame(Opcode.TEXT, payload.hex().encode())]
    if kind == "ping":
        return [Frame(Opcode.PING, payload[:125])]
    # a fragmented binary message, a ping between its fragments
    half = len(payload) // 2
    return [
        Frame(Opcode.BINARY, payload[:half], fin=False),
        Frame(Opcode.PING, b"between"),
        Frame(Opcode.CONT, payload[half:]),
    ]


def _stream(sent: list[tuple[str, bytes]]) -> bytes:
    return b"".join(
        f.serialize(mask=False) for kind, payload in sent for f in _server_frames(kind, payload)
    )


class Messages:
    """Whole messages out of websockets' events (fragments joined), as the client does."""

    def __init__(self, conn: ClientProtocol) -> None:
        self.conn = conn
        self.got: list[bytes] = []
        self.pongs = 0
        self._fragments: list[bytes] = []

    def message(self, data: bytes) -> None:
        self.got.append(data)

    def events(self) -> None:
        self.pongs += len(self.conn.data_to_send())
        for event in self.conn.events_received():
            assert isinstance(event, Frame)
            if event.opcode in (Opcode.PING, Opcode.PONG, Opcode.CLOSE):
                continue
            self._fragments.append(bytes(event.data))
            if event.fin:
                self.got.append(b"".join(self._fragments))
                self._fragments = []


def _by_websockets(data: bytes, cuts: list[int]) -> tuple[Messages, ClientProtocol]:
    conn = _client()
    out = Messages(conn)
    for chunk in _chunks(data, cuts):
        conn.receive_data(chunk)
        out.events()
    return out, conn


def _by_reader(data: bytes, cuts: list[int]) -> tuple[Messages, ClientProtocol]:
    conn = _client()
    out = Messages(conn)
    reader = IncomingFrames(conn, out.message, out.events)
    for chunk in _chunks(data, cuts):
        reader.feed(chunk)
    return out, conn


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(points)]


SENT = st.lists(
    st.tuples(
        st.sampled_from(["binary", "binary", "text", "ping", "fragmented"]),
        st.binary(max_size=300) | st.binary(min_size=126, max_size=LIMIT // 2),
    ),
    max_size=8,
)


@given(SENT, st.lists(st.integers(min_value=0), max_size=12))
def test_the_same_messages_as_websockets_however_the_bytes_are_cut(
    sent: list[tuple[str, bytes]], cuts: list[int]
) -> None:
    data = _stream(sent)
    expected, _ = _by_websockets(data, cuts)
    got, conn = _by_reader(data, cuts)
    assert got.got == expected.got
    assert got.pongs == expected.pongs  # every ping answered
    assert conn.state is State.OPEN and conn.parser_exc is None


@given(
    SENT,
    st.sampled_from(["masked", "too_large", "reserved", "opcode"]),
    st.lists(st.integers(0), max_size=6),
)
def test_a_frame_websockets_refuses_fails_the_connection_as_it_does(
    sent: list[tuple[str, bytes]], bad: str, cuts: list[int]
) -> None:
    if bad == "masked":
        wrong = Frame(Opcode.BINARY, b"masked").serialize(mask=True)
    elif bad == "too_large":
        wrong = Frame(Opcode.BINARY, bytes(LIMIT + 1)).serialize(mask=False)
    elif bad == "reserved":
        wrong = bytes([0x82 | 0x40, 3]) + b"rsv"  # RSV1 set, no extension negotiated
    else:
        wrong = bytes([0x83, 1]) + b"?"  # opcode 3: reserved
    data = _stream(sent) + wrong + _stream([("binary", b"after")])
    expected, ws_conn = _by_websockets(data, cuts)
    got, conn = _by_reader(data, cuts)
    assert got.got == expected.got
    assert b"after" not in got.got
    assert type(conn.parser_exc) is type(ws_conn.parser_exc) is not type(None)
    assert conn.close_code == ws_conn.close_code
