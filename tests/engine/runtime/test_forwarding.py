"""A cluster node without a replica of a queue serves it by forwarding (three nodes in
one process, the in-memory transport round-tripping every call through the wire): it
lists the queue, learns its leader from a member, runs every operation there, shows the
leader's stats with their age, learns the new leader after leadership moves (and moves
it), and forgets the queue once it is deleted."""

from __future__ import annotations

from pathlib import Path

from engine.errors import NoLeader, QueueNotFound
from engine.runtime import InMemoryNetwork
from engine.runtime.api import QueueArgs
from tests.engine.runtime.test_cluster import retrying
from tests.engine.runtime.test_meta_group import NAMES, cluster, group, held, stop_all
from tests.engine.runtime.util import eventually, msgs, run


def test_a_node_without_a_replica_forwards_to_the_leader(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES, wire=True)
        nodes = await cluster(tmp_path, network)
        try:
            info, created = await retrying(
                lambda: nodes["n1"].create_queue("q", QueueArgs(replicas=2))
            )
            assert created
            record = group(nodes["n1"]).machine.queues["q"]
            outsider = nodes[next(n for n in NAMES if n not in record.members)]
            await eventually(
                lambda: group(outsider).machine.queues["q"].state == "live", what="live"
            )
            assert info.uid not in held(outsider)
            assert [q.name for q in outsider.queues()] == ["q"]
            unknown = outsider.stats("q")
            assert unknown["status"] == "stale" and unknown["remote"] == {
                "from_node": None,
                "age_ms": None,
            }

            assert len(await retrying(lambda: outsider.publish("q", msgs("a", "b")))) == 2
            assert len(await outsider.publish("q", msgs("c"))) == 1
            leader = outsider.leader_of("q")
            assert leader in record.members
            stats = await outsider.fresh_stats("q")
            assert stats["messages_ready"] == 3 and stats["status"] == "ok", stats
            assert stats["remote"] == {"from_node": leader, "age_ms": 0}
            kept = outsider.stats("q")
            assert kept["messages_ready"] == 3 and kept["status"] == "ok", kept
            remote = kept["remote"]
            assert isinstance(remote, dict) and remote["from_node"] == leader, remote
            # Kept stats older than the limit are shown stale with their age, and fetched
            # again meanwhile.
            forwarder = outsider.context.forwarder
            fetched, at_ms = forwarder.stats["q"]
            forwarder.stats["q"] = (fetched, at_ms - 10_000)
            old = outsider.stats("q")
            assert old["status"] == "stale" and old["messages_ready"] == 3, old
            aged = old["remote"]
            assert isinstance(aged, dict) and aged["from_node"] == leader, aged
            assert aged["age_ms"] >= 10_000, aged
            await eventually(lambda: forwarder.stats["q"][1] >= at_ms, what="fetched again")
            assert outsider.stats("q")["status"] == "ok"
            browsed = await outsider.browse("q", after=None, limit=10)
            assert [m.body for m in browsed] == [b"a", b"b", b"c"]
            got = await outsider.receive(
                "q", consumer="c", max_messages=2, wait_ms=0, lease_ms=5_000
            )
            assert [m.body for m in got] == [b"a", b"b"]
            settled = await outsider.ack("q", [m.receipt for m in got])
            assert settled.settled == 2

            # Leadership moves: the kept leader is wrong once (the call is not retried,
            # it may have run), then the outsider asks again.
            other = next(m for m in record.members if m != leader)
            await retrying(lambda: nodes[leader].transfer_leadership("q", other))
            try:
                await outsider.publish("q", msgs("d"))
            except NoLeader:
                assert outsider.leader_of("q") is None
            await retrying(lambda: outsider.publish("q", msgs("e")))
            assert outsider.leader_of("q") == other
            later = await outsider.fresh_stats("q")
            assert later["remote"] == {"from_node": other, "age_ms": 0}
            # Leadership handed back through the outsider: it answers once the node leads.
            await retrying(lambda: outsider.transfer_leadership("q", leader))
            assert outsider.leader_of("q") == leader

            # Deleted: gone from the outsider too, and what it kept is dropped.
            await retrying(lambda: outsider.delete_queue("q"))
            assert outsider.queues() == []
            try:
                await outsider.publish("q", msgs("f"))
            except QueueNotFound:
                pass
            else:
                raise AssertionError("a deleted queue is not served")
            outsider.context.forwarder.prune()
            assert outsider.context.forwarder.leaders == {}
            assert outsider.context.forwarder.stats == {}
        finally:
            await stop_all(nodes)

    run(body(), timeout_s=90)
