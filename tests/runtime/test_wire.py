"""Everything a transport carries survives encode/decode as an equal value."""

from __future__ import annotations

import pytest

from engine.errors import Backpressure, NoLeader, QueueNotFound
from engine.ids import ServerId
from engine.raft.log import Entry, EntryKind
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
VALUES: list[object] = [
    VoteRequest(A, B, 3, 10, 2, True, False),
    VoteResponse(A, B, 3, True, False),
    AppendRequest(
        A,
        B,
        3,
        9,
        2,
        [
            Entry(10, 3, EntryKind.COMMAND, 1234, b"\x00data"),
            Entry(11, 3, EntryKind.NOOP, 1235, b""),
        ],
        9,
    ),
    AppendResponse(A, B, 3, False, 0, 9, 2, 5),
    Heartbeat(A, B, 3, 9, 4),
    HeartbeatResponse(A, B, 3, 4),
    SnapshotChunk(A, B, 3, 100, 2, 0, b"chunk", False),
    SnapshotResponse(A, B, 3, 100, -1),
    SnapshotChunk(A, B, 3, 100, 2, 40, b"", True, [Entry(7, 1, EntryKind.COMMAND, 5, b"p")]),
    SnapshotResponse(A, B, 3, 100, 40, b"\x01missing"),
    TimeoutNow(A, B, 3),
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
