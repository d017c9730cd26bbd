"""Everything a transport carries survives encode/decode as an equal value."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from engine.errors import Backpressure, NoLeader, QueueNotFound
from engine.ids import ServerId
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.runtime import wire
from engine.runtime.api import (
    BrowsedMessage,
    OutgoingMessage,
    QueueArgs,
    QueueInfo,
    ReceivedMessage,
    SettleResult,
)
from engine.runtime.meta import QueueMeta

A, B = ServerId("n1/q"), ServerId("n2/q")
REFUSAL = AppendResponse(
    src=A,
    dst=B,
    term=3,
    success=False,
    match_index=0,
    rejected_prev_index=9,
    conflict_term=2,
    conflict_index=5,
)
CHUNK = SnapshotChunk(
    src=A, dst=B, term=3, snapshot_index=100, snapshot_term=2, offset=0, data=b"chunk", done=False
)
VALUES: list[object] = [
    VoteRequest(src=A, dst=B, term=3, last_index=10, last_term=2, pre=True, transfer=False),
    VoteResponse(src=A, dst=B, term=3, granted=True, pre=False),
    AppendRequest(
        src=A,
        dst=B,
        term=3,
        prev_index=9,
        prev_term=2,
        entries=[
            Entry(10, 3, EntryKind.COMMAND, 1234, b"\x00data"),
            Entry(11, 3, EntryKind.NOOP, 1235, b""),
        ],
        commit=9,
    ),
    REFUSAL,
    Heartbeat(src=A, dst=B, term=3, commit=9, read_seq=4),
    HeartbeatResponse(src=A, dst=B, term=3, read_seq=4),
    CHUNK,
    SnapshotResponse(src=A, dst=B, term=3, snapshot_index=100, next_offset=-1),
    # The live entries after the checkpoint's bytes.
    dataclasses.replace(
        CHUNK, offset=40, data=b"", done=True, entries=[Entry(7, 1, EntryKind.COMMAND, 5, b"p")]
    ),
    SnapshotResponse(
        src=A, dst=B, term=3, snapshot_index=100, next_offset=40, missing=b"\x01missing"
    ),
    TimeoutNow(src=A, dst=B, term=3),
    QueueMeta("q", "uid", QueueArgs(replicas=3, dead_letter_queue="d"), 5, ("n1", "n2")),
    QueueInfo("q", "uid", QueueArgs(), 7),
    [OutgoingMessage(b"b", {"k": "v"}, 2, 100, 5, "id")],
    [ReceivedMessage(1, "r" * 32, b"x", {}, 0, 1, 2, 3)],
    [BrowsedMessage(1, 2, b"x", {"a": "b"}, 1, 0, 5)],
    SettleResult(2, (1,)),
    ["publish", "q", None, 1, {"max_length": 3}],
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip(value: object) -> None:
    back = wire.decode(wire.encode(value))
    assert back == value
    if isinstance(value, AppendRequest | SnapshotChunk):
        assert all(type(e.kind) is EntryKind for e in back.entries)


def test_errors_keep_their_class_and_detail() -> None:
    for error in (NoLeader("no leader"), Backpressure("slow down"), QueueNotFound("q")):
        back = wire.decode(wire.encode(error))
        assert type(back) is type(error) and back.detail == error.detail


def test_only_registered_types_encode() -> None:
    with pytest.raises(TypeError):
        wire.encode(object())


def test_a_message_travels_as_its_field_values_in_order() -> None:
    """The wire format does not depend on how messages are constructed: a positional
    list of field values, as before constructors became keyword-only."""
    ext = msgpack.unpackb(wire.encode(REFUSAL), raw=False)
    assert ext.code == wire.DATACLASS
    assert msgpack.unpackb(ext.data, raw=False) == [
        "AppendResponse",
        ["n1/q", "n2/q", 3, False, 0, 9, 2, 5],
    ]


def test_a_dataclass_with_the_wrong_field_count_is_refused() -> None:
    short = msgpack.ExtType(wire.DATACLASS, wire.encode(["TimeoutNow", ["n1/q", "n2/q"]]))
    with pytest.raises(ValueError, match="TimeoutNow: 2 fields, expected 3"):
        wire.decode(msgpack.packb(short))
