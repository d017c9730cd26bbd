"""What the node's memory alarm counts beside the queue machines: the WAL's mem tables
(entries durable in the WAL, not yet in segments) refuse publishes until the WAL rolls
and they are flushed, and the read cache of segment blocks gives its memory back to
publishes instead of refusing them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from engine.errors import MemoryAlarm
from engine.limits import KIB, MIB
from engine.runtime import Node
from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.util import eventually, rolling, run, started

BODY_BYTES = 16 * KIB
LIMITS = rolling(
    wal_file_bytes_max=8 * MIB,
    wal_batch_bytes_max=8 * MIB,
    wal_idle_roll_ms=300,
    engine_memory_bytes_max=2 * MIB,
    paged_index_bytes_per_queue_max=64 * KIB,
    paged_index_bytes_per_node_max=256 * KIB,
    memory_check_interval_ms=1,
    read_cache_bytes_max=1 * MIB,
    read_cache_block_bytes=256 * KIB,
)
"""Engine memory of 2 MiB; a WAL file holds four times that, so the mem tables reach
the limit before the WAL rolls, unless it idles 300 ms."""


def batch(tag: int, count: int) -> list[OutgoingMessage]:
    return [OutgoingMessage(bytes([tag % 256]) * BODY_BYTES) for _ in range(count)]


def memory(node: Node, key: str) -> int:
    value = node.memory()[key]
    assert isinstance(value, int)
    return value


def test_mem_tables_count_until_the_wal_rolls(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path, LIMITS)
        try:
            await node.create_queue("q", QueueArgs())
            refused = None
            for tag in range(20):  # 20 x 512 KiB: far past the limit
                try:
                    await node.publish("q", batch(tag, 32))
                except MemoryAlarm as e:
                    refused = e
                    break
            assert refused is not None, "the mem tables were not counted"
            assert memory(node, "mem_table_bytes") >= 2 * MIB - 600 * KIB
            # The machine holds a few dozen references: the mem tables made the alarm.
            assert memory(node, "memory_bytes") < 256 * KIB
            assert node.memory()["publishes_refused"] == 1
            # Nothing is published for 300 ms: the WAL rolls, its entries go to a
            # segment, the mem tables empty and the alarm clears by itself.
            await eventually(lambda: memory(node, "mem_table_bytes") < 256 * KIB, 10)
            await node.publish("q", batch(99, 32))
            assert node.memory()["publishes_refused"] == 1
        finally:
            await node.stop()

    run(body())


def test_the_read_cache_gives_its_memory_to_publishes(tmp_path: Path) -> None:
    limits = dataclasses.replace(LIMITS, engine_memory_bytes_max=3 * MIB // 2)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("q", QueueArgs())
            for tag in range(8):  # entries of 112 KiB, two to a block of the cache
                await node.publish("q", batch(tag, 7))
            await eventually(lambda: memory(node, "mem_table_bytes") < 64 * KIB, 10)
            bodies: list[int] = []
            for _ in range(8):
                got = await node.receive(
                    "q", consumer="c", max_messages=7, wait_ms=0, lease_ms=None
                )
                bodies += [m.body[0] for m in got]
            assert bodies == [k // 7 for k in range(56)]
            reads = node.stats("q")["read_cache"]
            assert isinstance(reads, dict)
            assert reads["segment_reads"] == 4 and reads["cache_hits"] == 4
            cached = memory(node, "read_cache_bytes")
            assert 896 * KIB < cached <= 1 * MIB  # the four blocks
            # A publish that fits only if the cache gives back its memory is accepted,
            # and the cache keeps only what the publish leaves under the limit.
            size = 60 * BODY_BYTES
            await node.publish("q", batch(9, 60))
            left = 3 * MIB // 2 - size - memory(node, "memory_bytes")
            assert memory(node, "read_cache_bytes") <= left < cached
            assert memory(node, "read_cache_evictions") >= 2
            assert node.memory()["publishes_refused"] == 0
        finally:
            await node.stop()

    run(body())


def test_a_refused_publish_rolls_the_wal_so_the_alarm_clears_while_it_is_busy(
    tmp_path: Path,
) -> None:
    """The WAL would not idle-roll for a minute: the refusal asks the writer to roll, the
    rolled file's entries go to a segment, and the next publish is accepted."""
    limits = dataclasses.replace(LIMITS, wal_idle_roll_ms=60_000)

    async def body() -> None:
        node = await started(tmp_path, limits)
        try:
            await node.create_queue("q", QueueArgs())
            refused = 0
            for tag in range(20):
                try:
                    await node.publish("q", batch(tag, 32))
                except MemoryAlarm:
                    refused += 1
                    break
            assert refused == 1
            await eventually(lambda: memory(node, "mem_table_bytes") < 256 * KIB, 10)
            await node.publish("q", batch(99, 32))
        finally:
            await node.stop()

    run(body())
