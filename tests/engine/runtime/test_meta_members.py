"""The metadata group's members follow its node records (real nodes in one process, the
in-memory transport): a node that joined is added as a learner and promoted while there
are fewer than five voters, a sixth stays a learner that applies the metadata, and a
forgotten voter is removed with a learner promoted in its place."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from engine.cluster import meta_commands as mc
from engine.cluster.records import split_address
from engine.limits import Limits
from engine.raft.config import Configuration
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from engine.runtime.meta_group import MetaBootstrap, MetaGroup
from engine.runtime.replica import node_of
from tests.engine.runtime.test_meta_group import LIMITS
from tests.engine.runtime.util import eventually, run


def address(name: str) -> str:
    return f"127.0.0.1:{7000 + int(name[1:])}"


def group(node: Node) -> MetaGroup:
    g = node.context.meta_group
    assert g is not None
    return g


async def start(
    root: Path, network: InMemoryNetwork, founders: list[str], limits: Limits = LIMITS
) -> dict[str, Node]:
    """Every node of ``network``: ``founders`` formed the cluster, the others will join."""
    boot = MetaBootstrap("test-cluster", {n: address(n) for n in founders})
    joined = MetaBootstrap("test-cluster", {}, joined=True)
    nodes = {
        name: Node(
            root / name,
            node_name=name,
            limits=limits,
            transport=network.transport(name),
            cluster=boot if name in founders else joined,
        )
        for name in network.names
    }
    await asyncio.gather(*(n.start() for n in nodes.values()))
    await eventually(lambda: all(group(nodes[n]).bootstrapped() for n in founders), 20)
    return nodes


def config(nodes: dict[str, Node]) -> Configuration:
    """The configuration of the metadata group's leader."""
    for node in nodes.values():
        g = group(node)
        if g.raft.leader is not None and node_of(g.raft.leader) == node.name:
            return g.raft.config
    return Configuration(())


def names(ids: tuple[str, ...]) -> list[str]:
    return [node_of(s) for s in ids]


def test_a_joined_node_becomes_a_learner_then_a_voter(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(["n1", "n2", "n3", "n4"])
        nodes = await start(tmp_path, network, ["n1", "n2", "n3"])
        try:
            n4 = group(nodes["n4"])
            assert n4.raft.config == Configuration(()) and not n4.caught_up()
            await group(nodes["n2"]).propose(mc.AddNode("n4", address("n4")))
            await eventually(lambda: names(config(nodes).voters) == ["n1", "n2", "n3", "n4"])
            await eventually(n4.caught_up, what="n4 applies the metadata")
            assert n4.machine.nodes["n4"].state == "active"
            assert n4.machine.cluster_id == "test-cluster"
            # n4 takes replicas like any node: four replicas on four nodes.
            await nodes["n1"].create_queue("q", QueueArgs(replicas=4))
            await eventually(lambda: "q" in nodes["n4"].context.replicas, what="n4's replica")
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body(), 90)


def test_a_sixth_node_stays_a_learner_until_a_forgotten_voter_leaves_room(
    tmp_path: Path,
) -> None:
    founders = ["n1", "n2", "n3", "n4", "n5"]

    async def body() -> None:
        network = InMemoryNetwork([*founders, "n6"])
        nodes = await start(tmp_path, network, founders)
        try:
            await group(nodes["n1"]).propose(mc.AddNode("n6", address("n6")))
            await eventually(lambda: names(config(nodes).learners) == ["n6"], 20)
            n6 = group(nodes["n6"])
            await eventually(n6.caught_up, what="the learner applies the metadata")
            await asyncio.sleep(3 * LIMITS.reconcile_interval_ms / 1000)
            assert names(config(nodes).voters) == founders, "five voters at most"
            # A voter that does not lead dies and is forgotten (a leader never removes
            # itself; a forgotten node still up learns it through the group first).
            leader = node_of(n6.raft.leader or "")
            gone = next(n for n in founders if n != leader)
            await nodes[gone].halt()
            await group(nodes[leader]).propose(mc.SetNodeState(gone, "lost"))
            await group(nodes[leader]).propose(mc.SetNodeState(gone, "forgotten"))
            voters = sorted({*founders, "n6"} - {gone})
            await eventually(lambda: names(config(nodes).voters) == voters, 20)
            assert config(nodes).learners == ()
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values() if n.context.running))

    run(body(), 120)


def test_addresses_in_the_metadata_parse_or_are_left_alone() -> None:
    assert split_address("127.0.0.1:7001") == ("127.0.0.1", 7001)
    assert split_address("[::1]:7002") == ("::1", 7002)
    assert split_address("host.example:80") == ("host.example", 80)
    for bad in ["", "host", "host:", ":80", "host:0", "host:99999", "host:x"]:
        assert split_address(bad) is None, bad


def test_a_draining_voter_hands_its_vote_to_a_learner_and_learns_on(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, meta_voters_max=3)
    founders = ["n1", "n2", "n3"]

    async def body() -> None:
        network = InMemoryNetwork([*founders, "n4"])
        nodes = await start(tmp_path, network, founders, limits)
        try:
            await group(nodes["n1"]).propose(mc.AddNode("n4", address("n4")))
            await eventually(lambda: names(config(nodes).learners) == ["n4"], 20)
            # The leader itself drains: it hands its leadership over, then its vote.
            n4 = group(nodes["n4"])
            await eventually(lambda: n4.raft.leader is not None, what="n4 hears the leader")
            drained = node_of(n4.raft.leader or "")
            await group(nodes["n4"]).propose(mc.SetNodeState(drained, "draining"))
            voters = sorted({*founders, "n4"} - {drained})
            await eventually(lambda: names(config(nodes).voters) == voters, 30)
            assert names(config(nodes).learners) == [drained]
            # It still applies the metadata, as a learner.
            await group(nodes["n4"]).propose(mc.AddNode("n5", address("n5")))
            mine = group(nodes[drained])
            await eventually(lambda: "n5" in mine.machine.nodes, what="the drained node learns")
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body(), 120)
