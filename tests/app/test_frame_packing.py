"""The app's frame packer: every frame packs exactly as ``msgpack.packb`` does, whatever
came before it (large or small, a frame that failed to pack), and a frame over the
bound does not leave its buffer kept."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.frame_packing import FramePacker

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.lists(VALUES, min_size=1, max_size=6))
def test_frames_pack_as_packb_does(frames: list[object]) -> None:
    packer = FramePacker(bytes_max=64)
    for frame in frames:
        assert packer.pack(frame) == msgpack.packb(frame, use_bin_type=True)


def test_a_packer_is_kept_only_while_its_frames_stay_under_the_bound() -> None:
    packer = FramePacker(bytes_max=1000)
    packer.pack({"op": "deliver", "messages": [b"x" * 10]})
    kept = packer._packer
    assert kept is not None
    packer.pack({"op": "deliver", "messages": [b"y" * 20]})
    assert packer._packer is kept
    big = {"op": "deliver", "messages": [b"z" * 2000]}
    assert packer.pack(big) == msgpack.packb(big, use_bin_type=True)
    assert packer._packer is None  # the grown buffer is let go
    assert packer.pack([1, 2]) == msgpack.packb([1, 2])


def test_a_frame_that_fails_to_pack_leaves_nothing_behind() -> None:
    packer = FramePacker()
    packer.pack({"a": 1})
    with pytest.raises(TypeError):
        packer.pack({"a": [1, object()]})
    assert packer.pack({"b": 2}) == msgpack.packb({"b": 2})


def test_a_frame_held_is_never_overwritten_and_the_packer_is_reused_once_let_go() -> None:
    packer = FramePacker()
    first = packer.pack({"op": "deliver", "messages": [b"a" * 100]})
    kept = packer._packer
    second = packer.pack({"op": "deliver", "messages": [b"b" * 100]})
    assert packer._packer is not kept  # the first frame's view lives: a new packer
    assert first == msgpack.packb({"op": "deliver", "messages": [b"a" * 100]})
    assert second == msgpack.packb({"op": "deliver", "messages": [b"b" * 100]})
    again = packer._packer
    del first, second
    assert packer.pack([3]) == msgpack.packb([3])
    assert packer._packer is again  # no view left: its buffer is used again
