"""What a node takes from its peers: a Raft message must come from the peer's own member
of a group this node hosts and be addressed to this node's member; the core refuses the
rest of what no correct peer sends; a forwarded call is checked and admitted as a local
one. Every refusal is counted, the node keeps serving."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from engine.errors import Backpressure, ValidationFailed
from engine.ids import NodeName, ServerId
from engine.limits import Limits
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import AppendRequest, Heartbeat
from engine.raft.role import Role
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from engine.runtime.meta import QueueMeta
from engine.runtime.routing import CreateReplica, DeleteReplica, ReceiveCall
from tests.engine.runtime.util import FAST, eventually, msgs, run


@asynccontextmanager
async def pair(root: Path, limits: Limits = FAST) -> AsyncIterator[tuple[Node, Node]]:
    """Nodes n1 and n2 with queue ``q`` on both, led by n1."""
    network = InMemoryNetwork(["n1", "n2"])
    nodes = [
        Node(root / n, node_name=n, limits=limits, transport=network.transport(n))
        for n in ("n1", "n2")
    ]
    for node in nodes:
        await node.start()
    try:
        await nodes[0].create_queue("q", QueueArgs(replicas=2))
        rep = nodes[0].context.replicas["q"]
        if rep.raft.role is not Role.LEADER:
            await nodes[1].transfer_leadership("q", "n1")
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            await node.stop()


def refused(node: Node) -> dict[str, int]:
    counts = node.cluster()["refused_from_peers"]
    assert isinstance(counts, dict)
    return counts


def test_a_message_must_come_from_the_peers_member_to_this_nodes_member(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (_n1, n2):
            rep = n2.context.replicas["q"]
            uid, term = rep.meta.uid, rep.raft.term
            n1_id, n2_id = ServerId(f"n1/{uid}"), rep.server_id

            def hb(src: str, dst: str, term: int = term) -> Heartbeat:
                return Heartbeat(
                    src=ServerId(src), dst=ServerId(dst), term=term, commit=0, read_seq=0
                )

            # From n1, but speaking for n3; for another group; to another member.
            n2.on_raft_message(NodeName("n1"), uid, hb(f"n3/{uid}", n2_id, term + 5))
            n2.on_raft_message(NodeName("n1"), uid, hb("n1/other", n2_id, term + 5))
            n2.on_raft_message(NodeName("n1"), uid, hb(n1_id, f"n3/{uid}", term + 5))
            n2.on_raft_message(NodeName("n1"), "nope", hb("n1/nope", "n2/nope"))
            assert rep.raft.term == term and rep.raft.leader == n1_id, "nothing moved"
            assert refused(n2) == {
                "group_not_hosted": 1,
                "not_addressed_here": 1,
                "sender_not_the_peer": 2,
            }
            assert len(await n2.publish("q", msgs("still served"))) == 1

    run(body())


def test_the_cores_refusals_are_counted_by_the_node(tmp_path: Path) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (n1, n2):
            rep = n2.context.replicas["q"]
            raft = rep.raft
            last, term = raft.log.last_index(), raft.term
            gap = [Entry(last + 2, term, EntryKind.COMMAND, 0, b"x")]
            bad = AppendRequest(
                src=ServerId(f"n1/{rep.meta.uid}"),
                dst=rep.server_id,
                term=term,
                prev_index=last,
                prev_term=raft.log.last_term(),
                entries=gap,
                commit=0,
            )
            n2.on_raft_message(NodeName("n1"), rep.meta.uid, bad)
            assert raft.log.last_index() == last
            assert refused(n2) == {"append_entries_not_in_sequence": 1}
            assert len(await n2.publish("q", msgs("still served"))) == 1
            assert refused(n1) == {}

    run(body())


def test_refusals_are_logged_once_per_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with pair(tmp_path) as (_n1, n2):
            uid = n2.context.replicas["q"].meta.uid
            junk = Heartbeat(
                src=ServerId(f"n9/{uid}"), dst=ServerId(f"n2/{uid}"), term=1, commit=0, read_seq=0
            )
            with caplog.at_level(logging.WARNING, logger="quorra.engine"):
                for _ in range(50):
                    n2.on_raft_message(NodeName("n1"), uid, junk)
            lines = [r for r in caplog.records if "from peers" in r.getMessage()]
            assert len(lines) == 1 and "sender_not_the_peer" in lines[0].getMessage()
            assert refused(n2) == {"sender_not_the_peer": 50}

    run(body())


def test_a_forwarded_call_is_checked_on_the_leaders_node(tmp_path: Path) -> None:
    """Before: the leader's node ran a peer's receive with no bound on its arguments,
    and made a directory of whatever uid a peer sent."""

    async def body() -> None:
        async with pair(tmp_path) as (n1, n2):
            to_n1 = n2.transport
            huge = ReceiveCall("q", "c", 10**9, 10**9, None, [])
            with pytest.raises(ValidationFailed, match="max_messages"):
                await to_n1.call(n1.name, huge)
            meta = QueueMeta("x", "../../escape", QueueArgs(replicas=1), 0, ("n1",))
            with pytest.raises(ValidationFailed, match="uid"):
                await to_n1.call(n1.name, CreateReplica(meta))
            with pytest.raises(ValidationFailed, match="uid"):
                await to_n1.call(n1.name, DeleteReplica("../q"))
            assert not (tmp_path / "escape").exists()
            assert [q.name for q in n1.queues()] == ["q"]

    run(body())


def test_a_forwarded_call_is_admitted_on_the_leaders_node(tmp_path: Path) -> None:
    """With one request in flight on n1 (a long poll), a call n2 forwards to n1 is
    refused as n1's own would be. Before: it ran past n1's limit."""
    limits = dataclasses.replace(FAST, inflight_requests_per_node_max=1)

    async def body() -> None:
        async with pair(tmp_path, limits) as (n1, n2):
            poll = asyncio.ensure_future(
                n1.receive("q", consumer="c", max_messages=1, wait_ms=3_000, lease_ms=None)
            )
            await eventually(lambda: n1.context.inflight_requests == 1, what="the long poll")
            with pytest.raises(Backpressure):
                await n2.publish("q", msgs("over the limit"))
            with pytest.raises(Backpressure):
                await n1.publish("q", msgs("over the limit"))
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)

    run(body())
