"""A replica whose files were damaged while its node was stopped is repaired from its
peers after the restart: nothing confirmed is lost, and it serves again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.errors import StorageFailed
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.test_cluster import (
    NAMES,
    cluster,
    leader_name,
    leader_of,
    restart,
    retrying,
)
from tests.engine.runtime.util import drain, eventually, msgs, rolling, run


def _damage_segment_data(data_dir: Path, uid: str) -> None:
    segments = sorted((data_dir / "queues" / uid / "segments").glob("*.seg"))
    assert segments, "a clean stop writes segments"
    with open(segments[0], "r+b") as f:
        f.seek(-3, 2)  # in the data of the segment's last entry
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0x10]))


def _damage_live_entries(node: Node, queue: str, data_dir: Path, *, count: int = 1) -> int:
    """Flip a bit in the bodies of the queue's ``count`` oldest live entries held in
    segments, where they are stored now (a compaction may have rewritten the first
    segment file): a lagging follower's catch-up needs the oldest, a consumer's receive
    meets one of them. Returns how many (none while a segment flush is unfinished)."""
    rep = node.context.replicas[queue]
    log = node.context.storage.log(rep.uid)
    damaged = 0
    for index in rep.machine.live_indexes():
        seg = log._segment_for(index)
        if seg is None or log.mem.get(index) is not None:
            continue  # read from memory (a segment flush may not have finished)
        reader = log._cache.get(seg.info)
        row = reader.position(index)
        assert row is not None
        offset = int(reader.index[row]["offset"]) + 1
        with open(data_dir / seg.info.path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x10]))
        damaged += 1
        if damaged == count:
            break
    return damaged


def deduped(bodies: list[bytes]) -> list[OutgoingMessage]:
    """A publish retried after ``NoLeader`` may have committed the first time: dedup ids
    keep the retry from storing the messages twice."""
    return [OutgoingMessage(body, dedup_id=body.decode()) for body in bodies]


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
                await retrying(lambda b=batch: nodes["n1"].publish("rep", deduped(b)))  # type: ignore[misc]
                confirmed.extend(batch)
            leader = leader_of(nodes, "rep")
            assert leader is not None
            victim = next(name for name in NAMES if name != leader)
            await nodes[victim].stop()
            _damage_segment_data(tmp_path / victim, info.uid)
            await restart(nodes, victim, tmp_path, network)
            assert nodes[victim].context.storage.repairing(info.uid), "the damage was found"
            await retrying(lambda: nodes[leader].publish("rep", deduped([b"after"])))
            confirmed.append(b"after")
            await eventually(
                lambda: _repaired(nodes[victim], "rep", len(confirmed)),
                timeout_s=20,
                what="the damaged replica repaired",
            )
            storage = nodes[victim].context.storage
            await eventually(lambda: not storage.repairing(info.uid), what="the marker gone")
            # Served by the repaired replica once it leads.
            await retrying(lambda: nodes[leader].transfer_leadership("rep", victim))
            await eventually(lambda: leader_of(nodes, "rep") == victim, what="a new leader")
            bodies = await retrying(lambda: drain(nodes[victim], "rep"))
            assert sorted(bodies) == sorted(confirmed)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


def test_a_leader_that_reads_a_damaged_entry_stops_and_is_repaired_after_a_restart(
    tmp_path: Path,
) -> None:
    limits = rolling()

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network, limits)
        confirmed: list[bytes] = []
        try:
            info, _ = await nodes["n1"].create_queue("rot", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "rot"))
            behind = next(name for name in NAMES if name != leader)
            network.isolate(behind)
            via = nodes[leader]
            confirmed += await _publish_large(via, "rot")
            # Bit rot in the leader's segments: the lagging follower needs the entry.
            await eventually(lambda: _damage_live_entries(via, "rot", tmp_path / leader) > 0)
            network.heal(behind)
            rep = via.context.replicas["rot"]
            await eventually(lambda: rep.failed is not None, what="the read found the damage")
            assert via.context.storage.repairing(info.uid)
            others = {k: v for k, v in nodes.items() if k != leader}
            await eventually(lambda: leader_of(others, "rot") is not None)
            await via.stop()
            await restart(nodes, leader, tmp_path, network, limits)
            await eventually(
                lambda: _repaired(nodes[leader], "rot", len(confirmed)),
                timeout_s=20,
                what="the damaged replica repaired",
            )
            new_leader = leader_of(nodes, "rot")
            assert new_leader is not None
            bodies = await retrying(lambda: drain(nodes[new_leader], "rot"))
            assert sorted(bodies) == sorted(confirmed)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())


async def _publish_large(node: Node, queue: str) -> list[bytes]:
    """300 messages of 4000 bytes in batches of 10: enough to roll a small WAL."""
    confirmed: list[bytes] = []
    for k in range(30):
        batch = [f"{k}-{i}".ljust(4000, ".").encode() for i in range(10)]
        await retrying(lambda b=batch: node.publish(queue, msgs(*b)))  # type: ignore[misc]
        confirmed.extend(batch)
    return confirmed


def _repaired(node: Node, queue: str, messages: int) -> bool:
    """Out of repair mode, with every confirmed message ready."""
    stats = node.stats(queue)
    raft = stats["raft"]
    assert isinstance(raft, dict)
    return not raft["repairing"] and stats["messages_ready"] == messages


def test_a_leader_that_reads_a_damaged_message_body_stops_and_the_message_is_delivered(
    tmp_path: Path,
) -> None:
    limits = rolling()

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network, limits)
        confirmed: list[bytes] = []
        try:
            info, _ = await nodes["n1"].create_queue("body", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "body"))
            via = nodes[leader]
            confirmed += await _publish_large(via, "body")
            # Damage the leader's copies: a receive on a follower is served by the leader.
            leader = await retrying(lambda: leader_name(nodes, "body"))
            via = nodes[leader]
            await eventually(
                lambda: _damage_live_entries(via, "body", tmp_path / leader, count=1000) > 0
            )
            rep = via.context.replicas["body"]
            got: list[bytes] = []
            # The damage is met by a receive, or first by a compaction that copies the
            # entry (acks make entries dead, which starts one): either stops the replica.
            while rep.failed is None:
                assert len(got) < len(confirmed), "the damaged body was never read"
                try:
                    batch_got = await via.receive(
                        "body", consumer="c", max_messages=10, wait_ms=0, lease_ms=300
                    )
                    await via.ack("body", [m.receipt for m in batch_got])
                except StorageFailed:
                    break
                got += [m.body for m in batch_got]  # settled: not delivered again
                if not batch_got:
                    await asyncio.sleep(0.02)
            assert rep.failed is not None
            assert via.context.storage.repairing(info.uid), "the repair is recorded"
            others = {k: v for k, v in nodes.items() if k != leader}
            new_leader = await retrying(lambda: leader_name(others, "body"))
            rest = await retrying(lambda: drain(nodes[new_leader], "body"))
            while len(got) + len(rest) < len(confirmed):  # the leased ones, once leases end
                await asyncio.sleep(0.1)
                rest += await retrying(lambda: drain(nodes[new_leader], "body"))
            assert sorted(got + rest) == sorted(confirmed)
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body())
