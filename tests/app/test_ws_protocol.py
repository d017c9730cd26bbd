"""The stream's WebSocket protocol writes a binary frame as websockets would serialize
it: the same head for every length class, the payload unchanged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from app.ws_protocol import binary_frame_head

LENGTHS = st.sampled_from([0, 1, 125, 126, 127, 65_535, 65_536, 1 << 20]) | st.integers(0, 70_000)


@given(LENGTHS)
def test_a_binary_frame_is_what_websockets_serializes(length: int) -> None:
    payload = bytes(length)
    expected = Frame(Opcode.BINARY, payload).serialize(mask=False)
    assert binary_frame_head(length) + payload == expected
