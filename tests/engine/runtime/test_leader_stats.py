"""A node whose replica of a queue follows shows the leader's stats of it, or its own
copy marked stale with its age when the leader cannot be asked (three nodes in one
process, the in-memory transport round-tripping every call through the wire)."""

from __future__ import annotations

from pathlib import Path

from engine.runtime import InMemoryNetwork
from engine.runtime.api import QueueArgs
from tests.engine.runtime.test_cluster import retrying
from tests.engine.runtime.test_meta_group import NAMES, cluster, stop_all
from tests.engine.runtime.util import eventually, msgs, run


def test_a_follower_shows_the_leaders_stats_or_its_own_marked_stale(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES, wire=True)
        nodes = await cluster(tmp_path, network)
        try:
            await retrying(lambda: nodes["n1"].create_queue("q", QueueArgs(replicas=3)))
            assert len(await retrying(lambda: nodes["n1"].publish("q", msgs("a", "b")))) == 2
            leader = nodes["n1"].leader_of("q")
            assert leader is not None
            follower = nodes[next(n for n in NAMES if n != leader)]
            await eventually(
                lambda: follower.stats("q")["messages_ready"] == 2, what="applied on the follower"
            )
            own = await nodes[leader].fresh_stats("q")
            assert "remote" not in own and own["status"] == "ok", own
            shown = await follower.fresh_stats("q")
            assert shown["remote"] == {"from_node": leader, "age_ms": 0}, shown
            assert shown["status"] == "ok" and shown["raft"] == own["raft"], (shown, own)

            network.isolate(follower.name)
            stale = await follower.fresh_stats("q")
            assert stale["status"] == "stale" and stale["messages_ready"] == 2, stale
            remote = stale["remote"]
            assert isinstance(remote, dict) and remote["from_node"] == follower.name, remote
            age = remote["age_ms"]
            assert isinstance(age, int) and age >= 0, remote
        finally:
            await stop_all(nodes)

    run(body())
