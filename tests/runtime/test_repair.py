"""A replica whose files were damaged while its node was stopped is repaired from its
peers after the restart: nothing confirmed is lost, and it serves again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import QueueArgs
from tests.runtime.test_cluster import NAMES, cluster, leader_of, retrying
from tests.runtime.util import FAST, drain, eventually, msgs, run


def _damage_segment_data(data_dir: Path, uid: str) -> None:
    segments = sorted((data_dir / "queues" / uid / "segments").glob("*.seg"))
    assert segments, "a clean stop writes segments"
    with open(segments[0], "r+b") as f:
        f.seek(-3, 2)  # in the data of the segment's last entry
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0x10]))


def test_a_replica_with_damaged_segment_data_is_repaired_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network)
        confirmed: list[bytes] = []
        try:
            info, _ = await nodes["n1"].create_queue("rep", QueueArgs())
            for k in range(30):
                batch = [f"m{k}-{i}".encode() for i in range(3)]
                await retrying(lambda b=batch: nodes["n1"].publish("rep", msgs(*b)))  # type: ignore[misc]
                confirmed.extend(batch)
            leader = leader_of(nodes, "rep")
            assert leader is not None
            victim = next(name for name in NAMES if name != leader)
            await nodes[victim].stop()
            _damage_segment_data(tmp_path / victim, info.uid)
            nodes[victim] = Node(
                tmp_path / victim,
                node_name=victim,
                limits=FAST,
                transport=network.transport(victim),
            )
            await nodes[victim].start()
            assert nodes[victim]._storage is not None
            assert nodes[victim]._storage.repairing(info.uid), "the damage was found"
            await retrying(lambda: nodes[leader].publish("rep", msgs("after")))
            confirmed.append(b"after")

            def repaired() -> bool:
                stats = nodes[victim].stats("rep")
                raft = stats["raft"]
                assert isinstance(raft, dict)
                return not raft["repairing"] and stats["messages_ready"] == len(confirmed)

            await eventually(repaired, timeout_s=20, what="the damaged replica repaired")
            storage = nodes[victim]._storage
            await eventually(lambda: not storage.repairing(info.uid), what="the marker gone")
            # Served by the repaired replica once it leads.
            await retrying(lambda: nodes[leader].transfer_leadership("rep", victim))
            await eventually(lambda: leader_of(nodes, "rep") == victim, what="a new leader")
            bodies = await retrying(lambda: drain(nodes[victim], "rep"))
            assert sorted(bodies) == sorted(confirmed)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())
