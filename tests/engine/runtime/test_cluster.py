"""Three nodes in one process joined by the in-memory transport: real replication."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from engine.errors import NoLeader, OutcomeUnknown, QueueConflict
from engine.ids import NodeName
from engine.limits import Limits
from engine.raft.messages import AppendResponse, Message
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from tests.engine.runtime.util import FAST, drain, eventually, msgs, rolling, run

T = TypeVar("T")
NAMES = ["n1", "n2", "n3"]


def node_on(root: Path, name: str, network: InMemoryNetwork, limits: Limits = FAST) -> Node:
    """Node ``name`` of the cluster, on its files under ``root`` (not started)."""
    return Node(root / name, node_name=name, limits=limits, transport=network.transport(name))


async def cluster(root: Path, network: InMemoryNetwork, limits: Limits = FAST) -> dict[str, Node]:
    nodes = {name: node_on(root, name, network, limits) for name in NAMES}
    await asyncio.gather(*(n.start() for n in nodes.values()))
    return nodes


async def restart(
    nodes: dict[str, Node], name: str, root: Path, network: InMemoryNetwork, limits: Limits = FAST
) -> Node:
    """Start ``name`` again on its files, in place of the stopped or halted one."""
    nodes[name] = node_on(root, name, network, limits)
    await nodes[name].start()
    return nodes[name]


async def retrying(call: Callable[[], Awaitable[T]], timeout_s: float = 10) -> T:
    """Retry while the queue has no leader (an election is running)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            return await call()
        except NoLeader:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)


def leader_of(nodes: dict[str, Node], queue: str) -> str | None:
    for name, node in nodes.items():
        stats = node.stats(queue)
        raft = stats["raft"]
        assert isinstance(raft, dict)
        if raft["role"] == "leader":
            return name
    return None


async def leader_name(nodes: dict[str, Node], queue: str) -> str:
    """``leader_of``, raising ``NoLeader`` while there is none (for ``retrying``)."""
    name = leader_of(nodes, queue)
    if name is None:
        raise NoLeader("no leader yet")
    return name


def test_replication_and_forwarding(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, created = await nodes["n1"].create_queue("rq", QueueArgs())
            assert created and info.args.replicas == 3
            for node in nodes.values():
                assert [q.uid for q in node.queues()] == [info.uid]
            for k, node in enumerate(nodes.values()):
                await retrying(
                    lambda n=node, k=k: n.publish("rq", msgs(*[f"{k}-{i}" for i in range(10)]))
                )  # type: ignore[misc]

            def replicated() -> bool:
                return all(n.stats("rq")["messages_ready"] == 30 for n in nodes.values())

            await eventually(replicated, what="30 messages on every replica")
            got = await nodes["n2"].receive(
                "rq", consumer="c", max_messages=5, wait_ms=0, lease_ms=None
            )
            assert len(got) == 5
            res = await nodes["n3"].ack("rq", [m.receipt for m in got])
            assert res.settled == 5
            leader = leader_of(nodes, "rq")
            assert leader is not None
            raft = nodes[leader].stats("rq")["raft"]
            assert isinstance(raft, dict)
            roles = sorted(m["role"] for m in raft["members"])
            assert roles == ["follower", "follower", "leader"]
            await eventually(
                lambda: all(n.stats("rq")["messages_ready"] == 25 for n in nodes.values()),
                what="the ack on every replica",
            )
            health = nodes["n1"].cluster()["nodes"]
            assert isinstance(health, list) and len(health) == 3
            await nodes["n2"].delete_queue("rq")
            assert all(n.queues() == [] for n in nodes.values())
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_leader_crash_failover_loses_nothing_confirmed(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        confirmed: list[bytes] = []
        try:
            await nodes["n1"].create_queue("fq", QueueArgs(lease_ms=60_000))

            async def publish_some(via: Node, tag: str, n: int) -> None:
                for i in range(n):
                    body = f"{tag}-{i}".encode()
                    await retrying(lambda b=body: via.publish("fq", msgs(b, dedup_id=b.decode())))  # type: ignore[misc]
                    confirmed.append(body)

            await publish_some(nodes["n2"], "before", 40)
            leader = leader_of(nodes, "fq")
            assert leader is not None
            # Publishes in flight while the leader dies: they either confirm or fail.
            survivor = next(n for name, n in nodes.items() if name != leader)
            inflight = asyncio.create_task(publish_some(survivor, "during", 20))
            await asyncio.sleep(0.01)
            await nodes[leader].halt()
            await inflight
            await publish_some(survivor, "after", 20)
            new_leader = leader_of({k: v for k, v in nodes.items() if k != leader}, "fq")
            assert new_leader is not None and new_leader != leader

            # The crashed node comes back on its files and catches up.
            await restart(nodes, leader, tmp_path, network)
            await eventually(
                lambda: nodes[leader].stats("fq")["messages_ready"] == len(confirmed),
                what="the restarted replica caught up",
            )
            bodies = await retrying(lambda: drain(nodes[leader], "fq"))
            assert sorted(bodies) == sorted(confirmed)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_whole_cluster_restart_recovers_definitions_and_messages(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            await nodes["n3"].create_queue("cq", QueueArgs(priorities=2))
            await retrying(lambda: nodes["n1"].publish("cq", msgs("lo", priority=0)))
            await retrying(lambda: nodes["n2"].publish("cq", msgs("hi", priority=1)))
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            for node in nodes.values():
                assert [(q.name, q.args.priorities) for q in node.queues()] == [("cq", 2)]
            assert await retrying(lambda: drain(nodes["n1"], "cq")) == [b"hi", b"lo"]
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_follower_behind_compaction_catches_up_by_snapshot(tmp_path: Path) -> None:
    limits = rolling(checkpoint_bytes_min=4096)

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network, limits)
        try:
            await nodes["n1"].create_queue("lag", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "lag"))
            behind = next(name for name in NAMES if name != leader)
            network.isolate(behind)
            via = nodes[leader]
            for k in range(70):
                await retrying(
                    lambda k=k: via.publish(
                        "lag", msgs(*[f"{k}-{i}".ljust(4000, ".") for i in range(10)])
                    )
                )  # type: ignore[misc]
                await retrying(lambda: drain(via, "lag"))
            await retrying(lambda: via.publish("lag", msgs("keep-1", "keep-2")))
            log_stats = via.stats("lag")["log"]
            assert isinstance(log_stats, dict) and log_stats["snapshot_index"] > 0
            network.heal(behind)
            await eventually(
                lambda: nodes[behind].stats("lag")["messages_ready"] == 2,
                timeout_s=20,
                what="the lagging follower caught up",
            )
            # The leader's log no longer held what the follower lacked: it sent a snapshot.
            assert nodes[leader].context.replicas["lag"].raft.snapshot is not None
            rep = nodes[behind].context.replicas["lag"]
            bodies = [m.body for m in nodes[behind].context.ops.browse_local(rep, None, 10)]
            assert bodies == [b"keep-1", b"keep-2"]
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_transfer_leadership(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            await nodes["n1"].create_queue("tq", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "tq"))
            target = next(name for name in NAMES if name != leader)
            other = next(name for name in NAMES if name not in (leader, target))
            # Asked through a node that does not lead: forwarded to the leader.
            await retrying(lambda: nodes[other].transfer_leadership("tq", target))
            assert leader_of(nodes, "tq") == target
            assert await retrying(lambda: nodes[leader].publish("tq", msgs("after")))
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_add_and_remove_members(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, _ = await nodes["n1"].create_queue("mq", QueueArgs(replicas=1))
            assert nodes["n2"].queues() == []
            await nodes["n1"].publish("mq", msgs("a", "b"))
            await retrying(lambda: nodes["n1"].add_member("mq", "n2"))
            await retrying(lambda: nodes["n2"].add_member("mq", "n3"))
            await eventually(
                lambda: all(n.stats("mq")["messages_ready"] == 2 for n in nodes.values()),
                what="the new replicas caught up",
            )
            for node in nodes.values():
                assert [q.uid for q in node.queues()] == [info.uid]
            await retrying(lambda: nodes["n3"].remove_member("mq", "n1"))
            assert nodes["n1"].queues() == []
            assert not (tmp_path / "n1" / "queues" / info.uid).exists()
            await retrying(lambda: nodes["n2"].publish("mq", msgs("c")))
            assert await retrying(lambda: drain(nodes["n3"], "mq")) == [b"a", b"b", b"c"]
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))
        # The definitions follow the configuration: a restart keeps the new members.
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            assert nodes["n1"].queues() == []
            await retrying(lambda: nodes["n2"].publish("mq", msgs("d")))
            assert await retrying(lambda: drain(nodes["n2"], "mq")) == [b"d"]
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_dead_letter_target_on_another_node(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            await nodes["n2"].create_queue("far-dlq", QueueArgs(replicas=1))
            await nodes["n1"].create_queue(
                "near", QueueArgs(replicas=1, dead_letter_queue="far-dlq")
            )
            await nodes["n1"].publish("near", msgs("bounce"))
            got = await nodes["n1"].receive(
                "near", consumer="c", max_messages=1, wait_ms=0, lease_ms=None
            )
            await nodes["n1"].nack("near", [got[0].receipt], requeue=False)
            dead = await nodes["n2"].receive(
                "far-dlq", consumer="d", max_messages=1, wait_ms=3000, lease_ms=None
            )
            assert [m.body for m in dead] == [b"bounce"]
            assert dead[0].headers["x-death-queue"] == "near"
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_a_refused_addition_leaves_no_replica_behind(tmp_path: Path) -> None:
    """Two additions at once: one change at a time, so one is refused; the node it was
    for hosts nothing afterwards (its replica was created first, then deleted)."""

    async def body() -> None:
        names = ["n1", "n2", "n3", "n4", "n5"]
        network = InMemoryNetwork(names)
        nodes = {n: node_on(tmp_path, n, network) for n in names}
        await asyncio.gather(*(n.start() for n in nodes.values()))
        try:
            info, _ = await nodes["n1"].create_queue("mq", QueueArgs(replicas=3))
            await retrying(lambda: nodes["n1"].publish("mq", msgs("a")))
            spares = [n for n in names if not nodes[n].queues()]
            assert len(spares) == 2
            results = await asyncio.gather(
                *(nodes["n1"].add_member("mq", spare) for spare in spares), return_exceptions=True
            )
            refused = [s for s, r in zip(spares, results, strict=True) if isinstance(r, Exception)]
            assert len(refused) == 1, results
            assert isinstance(results[spares.index(refused[0])], QueueConflict)
            added = next(s for s in spares if s not in refused)
            assert [q.uid for q in nodes[added].queues()] == [info.uid]
            await eventually(lambda: nodes[refused[0]].queues() == [], what="the orphan went")
            assert not (tmp_path / refused[0] / "queues" / info.uid).exists()
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_a_leader_cut_off_fails_its_waiting_proposals_when_it_steps_down(tmp_path: Path) -> None:
    """The proposals of a leader that loses its majority cannot be confirmed by it: they
    fail as ``OutcomeUnknown`` once it steps down (an election timeout, check-quorum),
    not at the proposal timeout (10 s)."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            await nodes["n1"].create_queue("cut", QueueArgs(replicas=3))
            await retrying(lambda: nodes["n1"].publish("cut", msgs("a")))
            leader = await retrying(lambda: leader_name(nodes, "cut"))
            network.isolate(leader)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(OutcomeUnknown):
                await nodes[leader].publish("cut", msgs("b"))
            assert loop.time() - started < FAST.proposal_timeout_ms / 1000 / 2
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_an_acknowledgement_that_commits_applies_before_the_turn_ends(tmp_path: Path) -> None:
    """The leader applies what an append's acknowledgement commits while it handles that
    acknowledgement, not at a later turn of the loop: the confirm of a replicated publish
    waits for it. (It applies only what its own disk holds too, so an acknowledgement
    that beats the leader's sync applies nothing: some of them do, the others after.)"""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        applied_at_once: list[tuple[object, object]] = []
        try:
            await nodes["n1"].create_queue("aq", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "aq"))
            node = nodes[leader]
            receive = node.on_raft_message

            def raft() -> dict[str, object]:
                stats = node.stats("aq")["raft"]
                assert isinstance(stats, dict)
                return stats

            def observed(src: NodeName, uid: str, message: Message) -> None:
                before = raft()["last_applied"]
                receive(src, uid, message)
                after = raft()
                if isinstance(message, AppendResponse) and after["last_applied"] != before:
                    applied_at_once.append((after["last_applied"], after["commit_index"]))

            node.on_raft_message = observed  # type: ignore[method-assign]
            for k in range(20):
                await node.publish("aq", msgs(f"m{k}"))
            assert applied_at_once, "no acknowledgement applied what it committed"
            assert all(applied == commit for applied, commit in applied_at_once)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())
