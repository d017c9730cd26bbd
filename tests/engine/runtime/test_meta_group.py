"""The cluster metadata group hosted by real nodes (three in one process, the in-memory
transport between them): bootstrap, creates and deletes through it, each node's
reconcile loop, membership changes recorded in it, restarts."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import TypeVar

from engine.cluster import meta_commands as mc
from engine.errors import NoLeader, QueueConflict, QueueNotFound
from engine.limits import Limits
from engine.raft.server import Role
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from engine.runtime.meta import QueueMeta
from engine.runtime.meta_group import META_UID, MetaBootstrap, MetaGroup
from engine.runtime.replica import node_of
from tests.engine.runtime.test_cluster import retrying
from tests.engine.runtime.util import FAST, drain, eventually, msgs, run

T = TypeVar("T")
NAMES = ["n1", "n2", "n3"]
LIMITS = dataclasses.replace(
    FAST,
    proposal_timeout_ms=FAST.leader_wait_ms,
    reconcile_interval_ms=200,
    meta_checkpoint_bytes_min=256,
    meta_record_bytes_estimate=16,
)
"""Small metadata checkpoints, so that a few commands checkpoint and compact its log."""
BOOT = MetaBootstrap("test-cluster", {n: f"127.0.0.1:{7000 + i}" for i, n in enumerate(NAMES)})


def node_on(root: Path, name: str, network: InMemoryNetwork, limits: Limits = LIMITS) -> Node:
    transport = network.transport(name)
    boot = dataclasses.replace(BOOT, incarnation=f"dir{name}")
    return Node(root / name, node_name=name, limits=limits, transport=transport, cluster=boot)


async def cluster(root: Path, network: InMemoryNetwork) -> dict[str, Node]:
    nodes = {name: node_on(root, name, network) for name in NAMES}
    await asyncio.gather(*(n.start() for n in nodes.values()))
    return nodes


async def stop_all(nodes: dict[str, Node]) -> None:
    await asyncio.gather(*(n.stop() for n in nodes.values()))


def group(node: Node) -> MetaGroup:
    g = node.context.meta_group
    assert g is not None
    return g


def held(node: Node) -> set[str]:
    return set(node.context.by_uid)


def test_the_first_leader_bootstraps_and_every_node_applies_it(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            await eventually(
                lambda: all(group(n).caught_up() for n in nodes.values()), what="bootstrap"
            )
            await eventually(lambda: all(len(group(n).machine.nodes) == 3 for n in nodes.values()))
            # Each node reports the data directory it runs from, once (reconcile loop).
            await eventually(
                lambda: all(
                    r.incarnation == f"dir{r.name}"
                    for n in nodes.values()
                    for r in group(n).machine.nodes.values()
                ),
                what="started",
            )
            for node in nodes.values():
                machine = group(node).machine
                assert machine.cluster_id == "test-cluster"
                assert sorted(machine.nodes) == NAMES
                assert machine.nodes["n2"].address == "127.0.0.1:7001"
                machine.check_invariants()
        finally:
            await stop_all(nodes)

    run(body())


def test_creates_and_deletes_go_through_the_metadata_and_replicas_follow(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            first, second = await asyncio.gather(
                retrying(lambda: nodes["n1"].create_queue("q", QueueArgs(replicas=2))),
                retrying(lambda: nodes["n3"].create_queue("q", QueueArgs(replicas=2))),
            )
            assert first[0].uid == second[0].uid
            assert sorted([first[1], second[1]]) == [False, True]
            uid = first[0].uid
            record = group(nodes["n2"]).machine.queue_by_uid(uid)
            assert record is not None and len(record.members) == 2
            await eventually(
                lambda: all((uid in held(nodes[m])) for m in record.members), what="replicas"
            )
            outsider = next(n for n in NAMES if n not in record.members)
            assert uid not in held(nodes[outsider])
            await eventually(
                lambda: group(nodes["n1"]).machine.queues["q"].state == "live", what="live"
            )
            member = nodes[record.members[0]]
            await retrying(lambda: member.publish("q", msgs("a", "b")))
            assert await drain(nodes[record.members[1]], "q") == [b"a", b"b"]
            try:
                await nodes["n2"].create_queue("q", QueueArgs(replicas=2, max_length=5))
            except QueueConflict:
                pass
            else:
                raise AssertionError("a name is unique cluster-wide")
            await retrying(lambda: nodes[outsider].delete_queue("q"))
            await eventually(lambda: all(not held(n) for n in nodes.values()), what="drops")
            await eventually(
                lambda: group(nodes["n1"]).machine.queues["q"].state == "tombstone",
                what="tombstone",
            )
            try:
                await nodes["n1"].delete_queue("q")
            except QueueNotFound:
                pass
            else:
                raise AssertionError("a deleted queue is gone")
            again, created = await retrying(
                lambda: nodes["n2"].create_queue("q", QueueArgs(replicas=3))
            )
            assert created and again.uid != uid
            await eventually(lambda: all(held(n) == {again.uid} for n in nodes.values()))
        finally:
            await stop_all(nodes)

    run(body())


def test_a_policy_change_reaches_the_metadata_and_a_lagging_record_is_repaired(
    tmp_path: Path,
) -> None:
    """The queue's log applies the change, then its leader records it in the metadata:
    a node without a replica lists it. A record left behind (a crash between the two
    commits, played here by proposing the old policy again) is repaired by the
    leader's reconcile pass; a replica created later starts from the first policy."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("p", QueueArgs(replicas=2)))
            record = group(nodes["n1"]).machine.queue_by_uid(info.uid)
            assert record is not None
            first = record.policy
            outsider = next(n for n in NAMES if n not in record.members)
            await eventually(
                lambda: group(nodes["n1"]).machine.queues["p"].state == "live", what="live"
            )
            changed = await retrying(lambda: nodes[outsider].update_policy("p", {"max_length": 7}))
            assert changed.args.max_length == 7
            for node in nodes.values():
                await eventually(
                    lambda n=node: group(n).machine.queues["p"].policy.max_length == 7,  # type: ignore[misc]
                    what="recorded",
                )
            rec = group(nodes[outsider]).machine.queues["p"]
            assert rec.created_policy == first and rec.first_policy == first
            listed = [q for q in nodes[outsider].queues() if q.name == "p"]
            assert listed[0].args.max_length == 7
            # The metadata falls behind the queue's log: the leader's pass repairs it.
            await group(nodes[outsider]).propose(mc.SetQueuePolicy(info.uid, first))
            await eventually(
                lambda: group(nodes[outsider]).machine.queues["p"].policy.max_length == 7,
                what="repaired",
            )
        finally:
            await stop_all(nodes)

    run(body())


def test_queues_are_listed_with_their_leaders_stats_or_stale_ones(tmp_path: Path) -> None:
    """A follower, and a node without a replica, list the queue with the stats its
    leader's node last answered to their periodic call (``leader_stats.LedStats``); cut off from
    the leader, the follower's turn stale."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("s", QueueArgs(replicas=2)))
            record = group(nodes["n1"]).machine.queue_by_uid(info.uid)
            assert record is not None
            await eventually(
                lambda: group(nodes["n1"]).machine.queues["s"].state == "live", what="live"
            )
            leader = await retrying(lambda: leader_of(nodes, "s"))
            follower = next(m for m in record.members if m != leader)
            outsider = next(n for n in NAMES if n not in record.members)
            await retrying(lambda: nodes[leader].publish("s", msgs("a", "b", "c")))

            def from_leader(name: str) -> bool:
                stats = nodes[name].stats("s")
                remote = stats.get("remote")
                return (
                    isinstance(remote, dict)
                    and remote["from_node"] == leader
                    and stats["messages_ready"] == 3
                    and stats["status"] == "ok"
                )

            await eventually(lambda: from_leader(follower), what="the follower's listing")
            await eventually(lambda: from_leader(outsider), what="the outsider's listing")
            assert "remote" not in nodes[leader].stats("s")  # the leader's own
            network.isolate(leader)
            await eventually(lambda: nodes[follower].stats("s")["status"] == "stale", what="stale")
            network.heal(leader)
        finally:
            await stop_all(nodes)

    run(body())


def test_a_node_down_creates_on_return_and_drops_orphans(tmp_path: Path) -> None:
    """The reconcile loop finishes what a node missed: a queue created while it was
    down, a delete it missed, and a replica no record places on it (an orphan, as a
    crash half-way through an older create could leave) goes."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            kept, _ = await retrying(lambda: nodes["n1"].create_queue("kept", QueueArgs()))
            gone, _ = await retrying(lambda: nodes["n1"].create_queue("gone", QueueArgs()))
            await eventually(lambda: held(nodes["n3"]) == {kept.uid, gone.uid})
            await nodes["n3"].halt()
            await retrying(lambda: nodes["n1"].delete_queue("gone"))
            late, _ = await retrying(lambda: nodes["n2"].create_queue("late", QueueArgs()))
            assert group(nodes["n1"]).machine.queues["gone"].state == "deleting"
            nodes["n3"] = node_on(tmp_path, "n3", network)
            orphan = QueueMeta("orphan", "f" * 32, QueueArgs(replicas=1), 1, ("n3",))
            await nodes["n3"].start()
            await nodes["n3"].context.catalog.create_replica(orphan)
            await eventually(
                lambda: held(nodes["n3"]) == {kept.uid, late.uid}, what="n3 reconciled"
            )
            await eventually(lambda: group(nodes["n2"]).machine.queues["gone"].state == "tombstone")
            queues = tmp_path / "n3" / "queues"
            await eventually(
                lambda: not (queues / gone.uid).exists() and not (queues / orphan.uid).exists(),
                what="their files removed",
            )
        finally:
            await stop_all(nodes)

    run(body())


def test_member_changes_are_recorded_and_the_metadata_survives_restarts(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("m", QueueArgs(replicas=2)))
            record = group(nodes["n1"]).machine.queue_by_uid(info.uid)
            assert record is not None
            outsider = next(n for n in NAMES if n not in record.members)
            await retrying(lambda: nodes["n1"].add_member("m", outsider))

            def recorded_added() -> bool:
                after = group(nodes["n1"]).machine.queue_by_uid(info.uid)
                return after is not None and outsider in after.members

            await eventually(recorded_added, what="the addition in n1's metadata")
            # Reconcile passes run meanwhile: the added replica is not an orphan.
            await asyncio.sleep(3 * LIMITS.reconcile_interval_ms / 1000)
            assert info.uid in held(nodes[outsider])
            await retrying(lambda: nodes["n1"].remove_member("m", outsider))
            await eventually(lambda: info.uid not in held(nodes[outsider]), what="removed")

            def recorded_removed() -> bool:
                # The leader's node waited for its own replica; n1's applies it soon.
                final = group(nodes["n1"]).machine.queue_by_uid(info.uid)
                return final is not None and outsider not in final.members

            await eventually(recorded_removed, what="the removal in n1's metadata")
            for i in range(20):  # enough commands for a few metadata checkpoints
                await retrying(lambda i=i: nodes["n2"].create_queue(f"x{i}", QueueArgs()))
            snapshot = group(nodes["n1"]).machine.snapshot()
            # The machine asked for checkpoints: written, and the log compacted behind.
            meta_dir = tmp_path / "n1" / "queues" / META_UID
            await eventually(lambda: any(meta_dir.rglob("*.chk")), what="a checkpoint")
            assert group(nodes["n1"]).log.snapshot_index() > 0
        finally:
            await stop_all(nodes)
        nodes = await cluster(tmp_path, network)
        try:
            await eventually(lambda: all(group(n).caught_up() for n in nodes.values()))
            for node in nodes.values():
                assert group(node).machine.snapshot() == snapshot
                assert group(node).driver is not None
            assert held(nodes["n1"]) >= {info.uid}
        finally:
            await stop_all(nodes)

    run(body())


def test_a_drain_interrupted_by_a_crash_is_finished_from_the_metadata(tmp_path: Path) -> None:
    """The leader of a queue placed a new replica in the metadata and crashed before its
    group added it; a drain is asked meanwhile. Once back, the moves go on from what the
    metadata and the group say: the placed replica is added, the draining node's removed,
    its messages all still there; a lost node with no replica left is then forgotten."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("d", QueueArgs(replicas=2)))
            meta = group(nodes["n1"]).machine
            record = meta.queue_by_uid(info.uid)
            assert record is not None
            outsider = next(n for n in NAMES if n not in record.members)
            leader = await retrying(lambda: leader_of(nodes, "d"))
            await retrying(lambda: nodes[leader].publish("d", msgs("a", "b", "c")))
            placed = mc.AddMember(info.uid, outsider, record.generation)
            await retrying(lambda: group(nodes[outsider]).propose(placed))
            await nodes[leader].halt()  # before its group added the placed replica
            draining = next(n for n in record.members if n != leader)
            await retrying(lambda: nodes[outsider].set_node_state(draining, "draining"))
            nodes[leader] = node_on(tmp_path, leader, network)
            await nodes[leader].start()

            def moved() -> bool:
                rec = group(nodes[outsider]).machine.queue_by_uid(info.uid)
                return rec is not None and rec.members == tuple(sorted((leader, outsider)))

            await eventually(moved, timeout_s=30, what="the replica moved off the drained node")
            await eventually(lambda: info.uid not in held(nodes[draining]), what="dropped")
            now = await retrying(lambda: leader_of(nodes, "d"))
            voters = {node_of(s) for s in nodes[now].context.replica("d").raft.config.voters}
            assert voters == {leader, outsider}
            assert sorted(await drain(nodes[now], "d")) == [b"a", b"b", b"c"]
            # A peer heard it from its data directory (a handshake): refused from another.
            assert nodes[outsider].stale_peer(draining, f"dir{draining}") is None
            assert nodes[outsider].stale_peer(draining, "a-new-directory") is not None
            entry = await retrying(lambda: nodes[now].set_node_state(draining, "lost"))
            assert entry["replicas"] == []
            await eventually(
                lambda: group(nodes[now]).machine.nodes[draining].state == "forgotten",
                what="the lost node forgotten",
            )
            # It learns it once it applies that entry too, and its server exits.
            await eventually(lambda: nodes[draining].forgotten, what="the node told")
            # Forgotten, it may join again from a new data directory (with --join).
            await eventually(lambda: draining not in group(nodes[outsider]).heard)
            assert nodes[outsider].stale_peer(draining, "a-new-directory") is None
            assert draining not in group(nodes[outsider]).heard
        finally:
            await stop_all(nodes)

    run(body(), timeout_s=90)


def test_a_forgotten_node_that_still_answers_stays_in_the_metadata_group(
    tmp_path: Path,
) -> None:
    """A forgotten node learns it by applying the entry that forgot it: the metadata
    group's leader removes it only once it no longer hears from it (it stopped), not in
    the moment after each check of its quorum, when no follower has answered yet; were
    it removed before it applied that entry, nothing would tell it."""
    limits = dataclasses.replace(LIMITS, reconcile_interval_ms=20)

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = {name: node_on(tmp_path, name, network, limits) for name in NAMES}
        await asyncio.gather(*(n.start() for n in nodes.values()))
        try:
            await eventually(lambda: all(group(n).caught_up() for n in nodes.values()))
            leader = await retrying(lambda: meta_leader(nodes))
            gone = next(n for n in NAMES if n != leader)
            await retrying(lambda: nodes[leader].set_node_state(gone, "lost"))
            await eventually(lambda: nodes[gone].forgotten, what="the node told")

            def member() -> bool:
                return gone in {node_of(s) for s in group(nodes[leader]).raft.config.members}

            # Many passes of the leader's (every 20 ms) while the node still answers.
            for _ in range(60):
                assert member(), "removed while it still answers"
                await asyncio.sleep(0.02)
            assert group(nodes[leader]).raft.role is Role.LEADER
            await nodes[gone].stop()
            await eventually(lambda: not member(), what="the stopped node removed")
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values() if n.context.running))

    run(body())


async def meta_leader(nodes: dict[str, Node]) -> str:
    for name, node in nodes.items():
        if group(node).raft.role is Role.LEADER:
            return name
    raise NoLeader("no metadata leader yet")


async def leader_of(nodes: dict[str, Node], name: str) -> str:
    for node in nodes.values():
        if not node.context.running:
            continue
        leader = node.leader_of(name)
        if leader is not None and nodes[leader].context.running:
            return leader
    raise NoLeader(f"no leader of {name} yet")


def test_a_founder_heard_from_one_data_directory_is_refused_from_another(
    tmp_path: Path,
) -> None:
    """Before the metadata records a founder (here before this node even started), a
    peer that heard it from one data directory refuses it from another; a node that is
    not a founder is not held to what was heard (``engine.cluster.rejoin``)."""
    node = node_on(tmp_path, "n1", InMemoryNetwork(NAMES))
    assert node.stale_peer("n3", "dirn3") is None
    why = node.stale_peer("n3", "another-directory")
    assert why is not None and "another data directory" in why, why
    assert node.stale_peer("n3", "dirn3") is None  # the first one still is
    assert group(node).heard["n3"] == "dirn3"
    assert node.stale_peer("n9", "dirn9") is None
    assert node.stale_peer("n9", "a-new-directory") is None


def test_the_formation_records_the_data_directories_its_leader_heard(tmp_path: Path) -> None:
    """A founder that proved itself in a handshake (n3 here, which then never runs: it
    lost its data directory before its first reconcile pass) is recorded with the data
    directory it named by the metadata's leader (with the formation, or at its next
    pass), so that it is refused if it comes back from another one; the leader records
    its own too (``engine.cluster.rejoin``)."""

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = {name: node_on(tmp_path, name, network) for name in ("n1", "n2")}
        for node in nodes.values():
            # As a TCP handshake does on every connection (before the node starts here).
            assert node.stale_peer("n3", "dirn3") is None
        await asyncio.gather(*(n.start() for n in nodes.values()))
        try:
            await eventually(
                lambda: all(
                    group(n).machine.nodes.get("n3") is not None
                    and group(n).machine.nodes["n3"].incarnation == "dirn3"
                    for n in nodes.values()
                ),
                what="n3 recorded",
            )
            machine = group(nodes["n1"]).machine
            assert machine.nodes["n1"].incarnation == "dirn1"
            why = nodes["n1"].stale_peer("n3", "another-directory")
            assert why is not None and "another data directory" in why, why
            assert nodes["n2"].stale_peer("n3", "dirn3") is None
        finally:
            await stop_all(nodes)

    run(body())
