"""The calls between nodes are typed: each crosses the wire as itself, and a call whose
shape is wrong is refused before it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cluster import (
    MembersChanged,
    Ok,
    QueueCreated,
    QueueDeleting,
    QueueExists,
    encode_command,
)
from engine.cluster.meta_commands import DeleteQueue
from engine.errors import ValidationFailed
from engine.runtime import InMemoryNetwork, Node, wire
from engine.runtime.api import OutgoingMessage, QueueArgs
from engine.runtime.meta import QueueMeta
from engine.runtime.routing import (
    CALL_TYPES,
    AddMemberCall,
    BrowseCall,
    CheckpointCall,
    CompactCall,
    CreateReplica,
    DeleteReplica,
    HistoryCall,
    JoinCall,
    LeaderOfCall,
    LedStatsCall,
    MetaPropose,
    MetaProposed,
    PublishCall,
    PublishRouted,
    PurgeCall,
    ReceiveCall,
    RemoveMemberCall,
    SegmentsCall,
    SettleCall,
    StatsCall,
    TransferCall,
    UpdatePolicyCall,
    check_call,
)
from tests.engine.runtime.util import FAST, drain, msgs, run

META = QueueMeta("q", "uid", QueueArgs(replicas=3, dead_letter_queue="d"), 5, ("n1", "n2"))
BATCH = [OutgoingMessage(b"b", {"k": "v"}, 2, 100, 5, "id")]
CALLS: list[object] = [
    CreateReplica(META),
    DeleteReplica("uid"),
    PublishRouted("d", BATCH),
    PublishCall("q", BATCH),
    ReceiveCall("q", "c", 10, 0, None, []),
    ReceiveCall("q", "c", 10, 500, 30_000, []),
    ReceiveCall("q", "c", 100, 0, None, ["r" * 64, "s" * 64]),
    SettleCall("q", "extend", ["r" * 32], 1_000),
    BrowseCall("q", None, 10),
    BrowseCall("q", 7, 10),
    PurgeCall("q"),
    StatsCall("q"),
    SegmentsCall("q"),
    CheckpointCall("q"),
    CompactCall("q", "auto"),
    CompactCall("q", 2),
    HistoryCall("q"),
    LeaderOfCall("q"),
    LedStatsCall(("q", "r")),
    UpdatePolicyCall("q", {"max_length": 3, "dead_letter_queue": None}),
    TransferCall("q", "n2"),
    AddMemberCall("q", "n3"),
    RemoveMemberCall("q", "n3"),
    MetaPropose(encode_command(DeleteQueue("q"))),
    JoinCall("n4", "127.0.0.1:7004"),
]


META_ANSWERS: list[MetaProposed] = [
    MetaProposed(7, Ok(True)),
    MetaProposed(8, QueueCreated("u" * 32, ("n1", "n2"), "n2")),
    MetaProposed(9, QueueExists("u" * 32)),
    MetaProposed(9, QueueDeleting("u" * 32)),
    MetaProposed(10, MembersChanged("u" * 32, ("n1",), 3)),
]


@pytest.mark.parametrize("answer", META_ANSWERS, ids=lambda a: type(a.reply).__name__)
def test_a_metadata_answer_crosses_the_wire_as_itself(answer: MetaProposed) -> None:
    assert wire.decode(wire.encode(answer)) == answer


def test_every_call_type_is_covered() -> None:
    assert {type(c) for c in CALLS} == set(CALL_TYPES)


@pytest.mark.parametrize("call", CALLS, ids=lambda c: type(c).__name__)
def test_a_call_crosses_the_wire_as_itself_and_passes_its_check(call: object) -> None:
    back = wire.decode(wire.encode(call))
    assert back == call
    assert check_call(back) is back


BAD: list[object] = [
    ("publish", "q", BATCH),
    PublishCall(1, BATCH),  # type: ignore[arg-type]
    PublishCall("q", [b"body"]),  # type: ignore[list-item]
    PublishCall("q", tuple(BATCH)),  # type: ignore[arg-type]
    ReceiveCall("q", "c", 10, None, None, []),  # type: ignore[arg-type]
    ReceiveCall("q", "c", 10, 0, None, [1]),  # type: ignore[list-item]
    ReceiveCall("q", "c", 10, 0, None, None),  # type: ignore[arg-type]
    SettleCall("q", "eat", ["r"], 0),  # type: ignore[arg-type]
    BrowseCall("q", "7", 10),  # type: ignore[arg-type]
    UpdatePolicyCall("q", {1: 3}),  # type: ignore[dict-item]
    CreateReplica({"name": "q"}),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call", BAD, ids=repr)
def test_a_call_of_the_wrong_shape_is_refused(call: object) -> None:
    with pytest.raises(ValidationFailed):
        check_call(call)


def test_a_peer_refuses_a_malformed_call_before_it_runs(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(["n1", "n2"])
        nodes = [
            Node(tmp_path / n, node_name=n, limits=FAST, transport=network.transport(n))
            for n in ("n1", "n2")
        ]
        for node in nodes:
            await node.start()
        try:
            await nodes[0].create_queue("q", QueueArgs(replicas=2))
            transport = network.transport("n1")
            bad: Any = PurgeCall(name=["q"])  # type: ignore[arg-type]
            with pytest.raises(ValidationFailed, match=r"PurgeCall\.name"):
                await transport.call(nodes[1].name, bad)
            with pytest.raises(ValidationFailed, match="not a call"):
                await transport.call(nodes[1].name, META)  # type: ignore[arg-type]
            # Well-formed calls still run: one of the two publishes is forwarded, a body
            # alone (``PublishItem``) crossing as a whole message.
            assert len(await nodes[0].publish("q", [*msgs("a"), b"c"])) == 2
            assert len(await nodes[1].publish("q", [*msgs("b"), b"d"])) == 2
            leader = next(n for n in nodes if n.leader_of("q") == n.name)
            assert await drain(leader, "q") == [b"a", b"c", b"b", b"d"]
        finally:
            for node in nodes:
                await node.stop()

    run(body())
