"""The stream's ``confirm`` frame, encoded by hand, is what MessagePack gives for it."""

from __future__ import annotations

import msgpack
from hypothesis import example, given
from hypothesis import strategies as st

from app.api.stream_frames import confirm_frame


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
@example(0)
@example(0x7F)
@example(0x80)
@example(0xFF)
@example(0x100)
@example(0xFFFF)
@example(0x10000)
@example(0xFFFFFFFF)
@example(1 << 32)
@example((1 << 63) - 1)
def test_a_confirm_frame_is_the_msgpack_of_its_map(seq: int) -> None:
    frame = confirm_frame(seq)
    assert frame == msgpack.packb({"op": "confirm", "seq": seq}, use_bin_type=True)
    assert msgpack.unpackb(frame) == {"op": "confirm", "seq": seq}
