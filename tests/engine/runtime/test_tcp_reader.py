"""The frame reader hands on every frame whole and in order, however the socket's reads
cut the stream, reads a large frame into a buffer of its own, and ends once on a bad
header, a refusal of what it handed on, or the end of the connection."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.runtime.tcp_frames import FrameError, frame
from engine.runtime.tcp_reader import (
    DIRECT_FRAME_BYTES_MIN,
    LARGE_BUFFER_KEPT_BYTES_MAX,
    SCRATCH_BYTES,
    FrameReader,
)

FRAME_BYTES_MAX = 4 * DIRECT_FRAME_BYTES_MIN


class Sink:
    def __init__(self, refuse_at: int | None = None) -> None:
        self.frames: list[bytes] = []
        self.ends: list[BaseException | None] = []
        self.refuse_at = refuse_at

    def on_frame(self, payload: memoryview) -> bool:
        if len(self.frames) == self.refuse_at:
            raise FrameError("refused")
        self.frames.append(bytes(payload))  # a view valid during the call only
        return True

    def reader(self) -> FrameReader:
        return FrameReader(FRAME_BYTES_MAX, self.on_frame, self.ends.append)


def read(reader: FrameReader, data: bytes, cuts: list[int]) -> None:
    """``data`` as the socket gives it: reads of at most the cut's size and the buffer's."""
    k, at = 0, 0
    while at < len(data):
        buffer = reader.get_buffer(-1)
        assert len(buffer) > 0
        n = min(len(buffer), cuts[k % len(cuts)], len(data) - at)
        buffer[:n] = data[at : at + n]
        reader.buffer_updated(n)
        at, k = at + n, k + 1


_PAYLOADS = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.integers(1, 3 * DIRECT_FRAME_BYTES_MIN).map(lambda n: bytes([n % 251]) * n),
    ),
    max_size=12,
)


@settings(max_examples=100, deadline=None)
@given(_PAYLOADS, st.lists(st.integers(1, 200_000), min_size=1, max_size=8), st.booleans())
def test_frames_arrive_whole_and_in_order_whatever_the_reads(
    payloads: list[bytes], cuts: list[int], fed_first: bool
) -> None:
    sink = Sink()
    reader = sink.reader()
    data = b"".join(frame(p) for p in payloads)
    if fed_first:  # what the handshake's reads left, then the socket's
        reader.feed(data[: len(data) // 3])
        data = data[len(data) // 3 :]
    read(reader, data, cuts)
    assert sink.frames == payloads
    assert sink.ends == []
    reader.connection_lost(None)
    reader.connection_lost(None)
    assert sink.ends == [None]


def test_a_large_frame_is_read_into_its_own_buffer_by_the_socket_and_it_is_kept() -> None:
    sink = Sink()
    reader = sink.reader()
    for k in (3, 2):  # the second, smaller, is read into the first one's buffer
        payload = bytes([k]) * (k * DIRECT_FRAME_BYTES_MIN)
        read(reader, frame(payload)[:1000], [1000])
        buffer = reader.get_buffer(-1)
        assert len(buffer) == len(payload) - (1000 - 4)  # the rest of the frame, no more
        assert buffer.obj is reader.get_buffer(-1).obj
        if k == 3:
            first = buffer.obj
        assert buffer.obj is first
        buffer[:] = payload[996:]
        reader.buffer_updated(len(buffer))
        assert sink.frames[-1] == payload


def test_a_frame_larger_than_the_kept_buffer_gets_one_of_its_own() -> None:
    sink = Sink()
    reader = FrameReader(2 * LARGE_BUFFER_KEPT_BYTES_MAX, sink.on_frame, sink.ends.append)
    payload = b"\x05" * (LARGE_BUFFER_KEPT_BYTES_MAX + 1)
    read(reader, frame(payload), [SCRATCH_BYTES])
    assert sink.frames == [payload]
    smaller = b"\x06" * (2 * DIRECT_FRAME_BYTES_MIN)
    read(reader, frame(smaller)[:1000], [1000])
    buffer = reader.get_buffer(-1).obj
    assert isinstance(buffer, bytearray) and len(buffer) == len(smaller)  # not the larger's
    assert sink.ends == []


def test_a_length_above_the_cap_ends_the_reading_once() -> None:
    sink = Sink()
    reader = sink.reader()
    read(reader, frame(b"ok") + (FRAME_BYTES_MAX + 1).to_bytes(4, "big") + b"x" * 10, [7])
    assert sink.frames == [b"ok"]
    assert len(sink.ends) == 1 and isinstance(sink.ends[0], FrameError)
    read(reader, frame(b"after"), [100])
    reader.connection_lost(None)
    assert sink.frames == [b"ok"] and len(sink.ends) == 1


def test_a_refused_frame_ends_the_reading() -> None:
    sink = Sink(refuse_at=1)
    reader = sink.reader()
    read(reader, frame(b"a") + frame(b"b") + frame(b"c"), [1000])
    assert sink.frames == [b"a"]
    assert len(sink.ends) == 1 and isinstance(sink.ends[0], FrameError)
