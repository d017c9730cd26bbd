"""The frames of the TCP transport: items round-trip, frames split at the cap, and no
byte stream, random or a mutated valid one, makes the decoder raise anything but
``FrameError``."""

from __future__ import annotations

import contextlib
import dataclasses

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import QueueNotFound
from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import AppendRequest, Heartbeat, SnapshotChunk, VoteRequest
from engine.runtime import wire
from engine.runtime.api import OutgoingMessage
from engine.runtime.routing import PublishCall, ReceiveCall
from engine.runtime.tcp_frames import (
    BLOBS_MARK,
    PROTOCOL_VERSION,
    FrameDecoder,
    FrameError,
    Hello,
    Item,
    Kind,
    Lane,
    decode_handshake,
    decode_items,
    encode_handshake,
    encode_hello,
    encode_item,
    frame,
    frames_of,
    lane_of,
    limits_fingerprint,
)
from engine.runtime.wire import CHUNK_BYTES_MIN

A, B = ServerId("n1/g"), ServerId("n2/g")
ITEMS = [
    Item(Kind.RAFT, "g", Heartbeat(src=A, dst=B, term=3, commit=9, read_seq=4)),
    Item(
        Kind.RAFT,
        "g",
        AppendRequest(
            src=A,
            dst=B,
            term=3,
            prev_index=9,
            prev_term=2,
            entries=[Entry(10, 3, EntryKind.COMMAND, 1234, b"\x00data")],
            commit=9,
        ),
    ),
    Item(Kind.CALL, 7, PublishCall("q", [OutgoingMessage(b"b", {"k": "v"}, 2, 100, 5, "id")])),
    Item(Kind.CALL, 8, ReceiveCall("q", "c", 10, 500, None, [])),
    Item(Kind.ANSWER, 7, [1, 2, 3]),
    Item(Kind.FAILURE, 8, QueueNotFound("no queue q")),
    Item(Kind.PING, 123456, None),
    Item(Kind.PONG, 123456, None),
]
FRAME_BYTES_MAX = 4096


def stream_of(items: list[Item], frame_bytes_max: int = FRAME_BYTES_MAX) -> bytes:
    encoded = [encode_item(i.kind, i.key, i.value) for i in items]
    return b"".join(f.joined() for f in frames_of(encoded, frame_bytes_max))


def decode_stream(data: bytes, chunk: int, frame_bytes_max: int = FRAME_BYTES_MAX) -> list[Item]:
    decoder = FrameDecoder(frame_bytes_max)
    out: list[Item] = []
    for k in range(0, len(data), chunk):
        decoder.feed(data[k : k + chunk])
        while (payload := decoder.next_frame()) is not None:
            out += decode_items(payload)
    return out


def test_items_round_trip_in_one_frame_whatever_the_reads() -> None:
    data = stream_of(ITEMS)
    for chunk in (1, 3, 7, len(data)):
        decoded = decode_stream(data, chunk)
        assert [(i.kind, i.key) for i in decoded] == [(i.kind, i.key) for i in ITEMS]
        assert [type(i.value) for i in decoded] == [type(i.value) for i in ITEMS]
        assert decoded[:5] == ITEMS[:5] and decoded[6:] == ITEMS[6:]
        failure = decoded[5].value
        assert isinstance(failure, QueueNotFound) and failure.detail == "no queue q"


def test_an_item_without_blobs_is_one_document_of_kind_key_and_value() -> None:
    for item in ITEMS:
        encoded = encode_item(item.kind, item.key, item.value)
        assert encoded.blobs == [] and encoded.blobs_bytes == 0
        assert encoded.joined() == wire.encode([int(item.kind), item.key, item.value])
        assert encoded.size == len(encoded.joined())


def test_frames_split_at_the_cap_in_order() -> None:
    items = [Item(Kind.ANSWER, k, b"x" * 1000) for k in range(20)]
    encoded = [encode_item(i.kind, i.key, i.value) for i in items]
    frames = frames_of(encoded, FRAME_BYTES_MAX)
    assert len(frames) == 5  # four items of ~1 KiB per 4 KiB frame
    assert all(f.size - 4 <= FRAME_BYTES_MAX for f in frames)
    assert all(f.size == len(f.joined()) for f in frames)
    assert decode_stream(b"".join(f.joined() for f in frames), 100) == items


def test_a_length_above_the_cap_is_refused_before_its_bytes_arrive() -> None:
    decoder = FrameDecoder(FRAME_BYTES_MAX)
    decoder.feed((FRAME_BYTES_MAX + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError, match="4097 bytes"):
        decoder.next_frame()


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x90",  # an empty list
        msgpack.packb([[0, "g", "not a message"]]),
        msgpack.packb([[1, 5, "not a call"]]),
        msgpack.packb([[3, 5, "not an error"]]),
        msgpack.packb([[9, 5, None]]),
        msgpack.packb([[0, 5]]),
        msgpack.packb({"t": "hello"}),
        encode_item(Kind.PING, 1, None).joined() + b"trailing",
    ],
)
def test_bad_frames_are_frame_errors(payload: bytes) -> None:
    with pytest.raises(FrameError):
        decode_items(payload)


def test_a_call_item_must_hold_a_call() -> None:
    vote = VoteRequest(src=A, dst=B, term=1, last_index=0, last_term=0, pre=False, transfer=False)
    with pytest.raises(FrameError, match="not a call"):
        decode_items(b"\x91" + encode_item(Kind.CALL, 1, vote).joined())


def test_lanes() -> None:
    chunk = SnapshotChunk(
        src=A, dst=B, term=1, snapshot_index=1, snapshot_term=1, offset=0, data=b"", done=True
    )
    assert lane_of(chunk) is Lane.BULK
    assert lane_of(ITEMS[1].value) is Lane.BULK
    assert lane_of(ITEMS[0].value) is Lane.CONTROL


def test_handshake_frames_are_checked() -> None:
    hello = Hello(PROTOCOL_VERSION, "c", "n1", "n2", 0, "f" * 16, b"n" * 32)
    tag, fields = decode_handshake(encode_hello(hello)[4:])
    assert tag == "hello" and fields["src"] == "n1" and fields["nonce"] == b"n" * 32
    assert decode_handshake(encode_handshake("welcome")[4:]) == ("welcome", {})
    later = PROTOCOL_VERSION + 1
    future = msgpack.packb({"t": "hello", "magic": "quorra-cluster", "version": later, "x": 1})
    assert decode_handshake(future) == ("hello", {"version": later})
    wrong_type = msgpack.packb({"t": "proof", "mac": "text"})
    extra = msgpack.packb({"t": "welcome", "x": 1})
    not_ours = msgpack.packb({"t": "hello", "magic": "http", "version": 1})
    ext = msgpack.packb({"t": "proof", "mac": msgpack.ExtType(1, b"")})
    for payload in (wrong_type, extra, not_ours, ext, b"\xc1", msgpack.packb([1])):
        with pytest.raises(FrameError):
            decode_handshake(payload)


def test_the_limits_fingerprint_follows_every_limit() -> None:
    other = dataclasses.replace(DEFAULT_LIMITS, cluster_ping_interval_ms=200)
    same = dataclasses.replace(DEFAULT_LIMITS)
    assert limits_fingerprint(DEFAULT_LIMITS) == limits_fingerprint(same)
    assert limits_fingerprint(DEFAULT_LIMITS) != limits_fingerprint(other)


def _only_frame_errors(data: bytes, chunk: int, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
    decoder = FrameDecoder(frame_bytes_max)
    try:
        for k in range(0, len(data), chunk):
            decoder.feed(data[k : k + chunk])
            while (payload := decoder.next_frame()) is not None:
                for decode in (decode_items, decode_handshake):
                    with contextlib.suppress(FrameError):
                        decode(payload)
    except FrameError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 64))
def test_random_streams_raise_only_frame_errors(data: bytes, chunk: int) -> None:
    _only_frame_errors(data, chunk)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 64))
def test_random_frames_raise_only_frame_errors(body: bytes, chunk: int) -> None:
    _only_frame_errors(frame(body) + frame(b"\x91" + body), chunk)


VALID = (
    stream_of(ITEMS)
    + encode_handshake("challenge", nonce=b"n" * 32, incarnation="i", mac=b"m" * 32)
    + encode_handshake("refused", reason="no")
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=8),
    st.integers(0, len(VALID)),
    st.integers(0, 16),
    st.integers(1, 64),
)
def test_mutated_streams_raise_only_frame_errors(
    flips: list[tuple[int, int]], cut: int, gap: int, chunk: int
) -> None:
    """Bytes changed, a few removed, the stream cut short."""
    data = bytearray(VALID)
    for position, value in flips:
        data[position] = value
    _only_frame_errors(bytes(data[:cut] + data[cut + gap :]), chunk)
    _only_frame_errors(bytes(data[:cut]), chunk)


WIRE_NAMES = [
    "Heartbeat",
    "AppendRequest",
    "SnapshotChunk",
    "Entry",
    "QueueMeta",
    "QueueArgs",
    "SettleResult",
    "OutgoingMessage",
    "DeleteReplica",
    "PublishCall",
    "ReceiveCall",
    "NoSuchType",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=4)
    | st.binary(max_size=4)
)
FIELDS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4), max_leaves=12)


@st.composite
def wire_values(draw: st.DrawFn, depth: int = 2) -> object:
    """A wire extension (a named type with random fields, or an error) or a plain value."""
    code = draw(st.sampled_from([1, 2, 3, None]))
    if code is None or depth == 0:
        return draw(FIELDS)
    name = draw(st.sampled_from([*WIRE_NAMES, "QueueNotFound", "EntryDamaged"]))
    fields = draw(st.lists(FIELDS | wire_values(depth - 1), max_size=8))
    payload = [name, fields] if code == 1 else [name, draw(FIELDS)]
    return msgpack.ExtType(code, msgpack.packb(payload))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(-1, 7), st.integers(0, 9) | st.text(max_size=3), wire_values()),
        min_size=1,
        max_size=4,
    )
)
def test_items_of_wire_types_with_wrong_fields_raise_only_frame_errors(
    items: list[tuple[int, object, object]],
) -> None:
    """Items well framed and typed on the outside, their values of registered types with
    fields of any kind and number: each is a good item or a ``FrameError``."""
    payload = msgpack.packb([list(i) for i in items])
    with contextlib.suppress(FrameError):
        decode_items(payload)


BLOBS_FRAME_BYTES_MAX = 64 * 1024
BLOB_ITEMS = [
    Item(
        Kind.RAFT,
        "g",
        AppendRequest(
            src=A,
            dst=B,
            term=3,
            prev_index=9,
            prev_term=2,
            entries=[
                Entry(10, 3, EntryKind.COMMAND, 1, b"\x01" * CHUNK_BYTES_MIN),
                Entry(11, 3, EntryKind.COMMAND, 2, b"small"),
                Entry(12, 3, EntryKind.COMMAND, 3, b"\x02" * (CHUNK_BYTES_MIN + 1)),
            ],
            commit=9,
        ),
    ),
    Item(Kind.PING, 1, None),
]
VALID_BLOBS = stream_of(BLOB_ITEMS, BLOBS_FRAME_BYTES_MAX)


def test_a_frame_with_blobs_carries_the_entries_after_its_document() -> None:
    assert VALID_BLOBS[4:5] == BLOBS_MARK
    assert VALID_BLOBS.endswith(b"\x01" * CHUNK_BYTES_MIN + b"\x02" * (CHUNK_BYTES_MIN + 1))
    for chunk in (1, 999, len(VALID_BLOBS)):
        assert decode_stream(VALID_BLOBS, chunk, BLOBS_FRAME_BYTES_MAX) == BLOB_ITEMS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    st.integers(0, len(VALID_BLOBS)),
    st.integers(0, 16),
)
def test_mutated_frames_with_blobs_raise_only_frame_errors(
    flips: list[tuple[int, int]], cut: int, gap: int
) -> None:
    """The document's bytes and lengths changed, a few removed, the stream cut short."""
    data = bytearray(VALID_BLOBS)
    for position, value in flips:
        data[position] = value
    _only_frame_errors(bytes(data[:cut] + data[cut + gap :]), 997, BLOBS_FRAME_BYTES_MAX)
    _only_frame_errors(bytes(data[:cut]), 997, BLOBS_FRAME_BYTES_MAX)
