"""Frames encoded without ``msgpack.packb`` are what it gives: the server's ``confirm``
frame, encoded by hand, and the client's frames, by a kept packer."""

from __future__ import annotations

import msgpack
from hypothesis import example, given
from hypothesis import strategies as st

from app.api.stream_frames import confirm_frame
from quorra.client._ledger import pack


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


FRAMES = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.text()
        | st.binary(max_size=2048),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    ),
    max_size=5,
)  # fmt: skip


@given(FRAMES, FRAMES)
def test_the_clients_frames_are_the_msgpack_of_their_maps_even_after_a_refused_one(
    first: dict[str, object], second: dict[str, object]
) -> None:
    assert pack(first) == msgpack.packb(first, use_bin_type=True)
    try:
        pack({"op": "publish", "messages": [first, object()]})
    except TypeError:
        pass  # nothing of it stays in the packer
    else:
        raise AssertionError("an object was packed")
    assert pack(second) == msgpack.packb(second, use_bin_type=True)
