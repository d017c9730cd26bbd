"""A node without a replica of a queue asks its leader's node for the queue's history
(``engine.runtime.leader_history``; three nodes in one process, every call round-tripped
through the wire): the leader's node answers from its history source, bounded; a node
with a replica keeps its own; a leader's node that keeps none, or does not answer in
time, makes the history ``absent`` with why."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import (
    CheckpointRecord,
    CompactionRecord,
    LeaderHistory,
    QueueArgs,
    QueueHistory,
)
from tests.engine.runtime.test_cluster import retrying
from tests.engine.runtime.test_meta_group import LIMITS, NAMES, group, node_on, stop_all
from tests.engine.runtime.util import eventually, run

HISTORY_LIMITS = dataclasses.replace(LIMITS, history_records_max=3, leader_history_deadline_ms=400)


def _checkpoint(name: str, index: int) -> CheckpointRecord:
    return CheckpointRecord(name, index, 1, 1_700_000_000_000 + index, 100, 5, "auto", 1.5)


def _compaction(name: str, at_ms: int) -> CompactionRecord:
    return CompactionRecord(name, "1", "manual", at_ms, 2.0, 3, 1, 300, 100, 5, 10, 0)


def test_a_node_without_a_replica_shows_its_leaders_history(tmp_path: Path) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES, wire=True)
        nodes = {n: node_on(tmp_path, n, network, HISTORY_LIMITS) for n in NAMES}
        await asyncio.gather(*(n.start() for n in nodes.values()))
        asked: list[tuple[str, str, int]] = []
        hanging = asyncio.Event()

        async def source(name: str, uid: str, limit: int) -> QueueHistory:
            asked.append((name, uid, limit))
            if hanging.is_set():
                await asyncio.sleep(60)
            # More than the limit: the serving node cuts the answer to it.
            return QueueHistory(
                [_checkpoint(name, i) for i in (9, 8, 7, 6, 5)],
                [_compaction(name, t) for t in (40, 30)],
            )

        try:
            info, _ = await retrying(lambda: nodes["n1"].create_queue("h", QueueArgs(replicas=2)))
            record = group(nodes["n1"]).machine.queues["h"]
            outsider = nodes[next(n for n in NAMES if n not in record.members)]
            member = nodes[record.members[0]]
            await eventually(
                lambda: group(outsider).machine.queues["h"].state == "live", what="live"
            )
            assert await member.leader_history("h") is None  # a replica: its own SQLite

            # No node keeps a history yet (no app attached): absent, and why.
            absent = await _until_named(outsider)
            assert absent.status == "absent" and absent.history == QueueHistory([], []), absent
            assert absent.from_node in record.members, absent

            for node in nodes.values():
                node.set_history_source(source)
            got = await outsider.leader_history("h")
            assert got is not None and got.status == "ok", got
            leader = outsider.leader_of("h")
            assert got.from_node == leader and leader in record.members
            assert [r.index for r in got.history.snapshots] == [9, 8, 7]
            assert got.history.compactions == [_compaction("h", 40), _compaction("h", 30)]
            assert asked[-1] == ("h", info.uid, 3)

            # The leader's node does not answer in time: absent, within the deadline.
            hanging.set()
            loop = asyncio.get_running_loop()
            started = loop.time()
            late = await outsider.leader_history("h")
            assert loop.time() - started < 2.0
            assert late is not None and late.status == "absent", late
            assert "did not answer within 400 ms" in late.detail, late
            assert late.history == QueueHistory([], [])
        finally:
            await stop_all(nodes)

    run(body())


async def _until_named(node: Node) -> LeaderHistory:
    """The outsider's answer once the leader's node says it keeps no history (before an
    election ends, the look-up itself fails: absent too, with another reason)."""
    for _ in range(50):
        got = await node.leader_history("h")
        assert got is not None and got.status == "absent", got
        if "keeps no history" in got.detail:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"still {got}")
