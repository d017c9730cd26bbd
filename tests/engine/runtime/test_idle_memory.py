"""What an idle queue costs a node: its replica (Raft core, machine, storage log, page
files, rate samples) measured by tracemalloc on a running node, awake and asleep."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import tracemalloc
from pathlib import Path

from engine.runtime import Node
from engine.runtime.api import QueueArgs
from tests.engine.runtime.util import FAST, eventually, msgs, run

IDLE_REPLICA_BYTES_MAX = 6_900
"""An idle queue of 10 messages on a node, everything the engine keeps for it: about
6.3 KB; 6.7 KB before its page files and mem table shared their empty containers and
lock; 6.9 KB before queues with equal arguments shared them, 8.9-9.0 KB before its
machine's counters left their dict, its lanes their extra tuples, and its machine, Raft
core and replica shared their empty lease tables, lists and dicts; 12.1 KB before its
Raft core made its ``Ready`` lazily, its pages left their deque, its rate samples became
runs and its empty tables were shared or cleared."""
SLEEPING_REPLICA_BYTES_MAX = 3_000
"""The same queue asleep (``engine.runtime.hibernation``): about 2.75 KB here (3.0 KB
before its record became one ``bytes`` beside its policy head and its page files were
packed; 3.3 KB
before its storage log was packed into one ``bytes`` while it sleeps; 3.45 KB
before the records shared their snapshots' policy bytes, 3.55 KB
before a log with nothing to flush shared one empty mem table; 3.7 KB
before its seal kept the uid as the definition's string and its rate samples and
checkpoint info were shared while empty; 4.1 KB
before the shared empties of its storage log and page files, 4.3 KB before the shared
arguments; an empty live set's ``BitMap64`` also held ~210 bytes that tracemalloc does
not see; 3.5 KB over 300 queues, the node's own tables growing in
steps), its machine, Raft core and driver swapped for a record of about 0.8 KB
(snapshot, packed stats, positions, live set); what is left is mostly its storage log,
page files, definition and ``Replica``."""
QUEUES = 60


def test_an_idle_queue_costs_the_node_a_bounded_few_kilobytes(tmp_path: Path) -> None:
    limits = dataclasses.replace(
        FAST,
        wal_idle_roll_ms=200,
        rate_sample_ms=100,
        rate_window_ms=1_000,
        queue_sleep_idle_ms=3_000,  # after the awake measurement
        queue_sleep_sweep_ms=50,
    )

    async def body() -> tuple[float, float]:
        node = Node(tmp_path, limits=limits)
        await node.start()
        try:

            async def idle_queue(n: int) -> None:
                await node.create_queue(f"q{n}", QueueArgs())
                await node.publish(f"q{n}", msgs(*[b"m" * 64] * 10))

            async def sampled(names: list[str]) -> None:
                """Stats read over a few rate periods, as the dashboard does."""
                for _ in range(6):
                    for name in names:
                        node.summary(name)
                    await asyncio.sleep(0.12)

            async def flushed() -> None:
                """The WAL rolled and its entries are in segments (what a mem table and
                a flush running hold is not a queue's own)."""

                def done() -> bool:
                    empty = node.memory()["mem_table_bytes"] == 0
                    return empty and node.context.hosting.flush_task is None

                await eventually(done, timeout_s=30, what="the mem tables flushed")

            await idle_queue(0)  # first uses (caches, the WAL writer) are not a queue's
            await sampled(["q0"])
            await flushed()
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                for n in range(1, QUEUES + 1):
                    await idle_queue(n)
                await flushed()
                names = [f"q{n}" for n in range(1, QUEUES + 1)]
                await sampled(names)
                gc.collect()
                after = tracemalloc.take_snapshot()
                reps = node.context.replicas
                await eventually(
                    lambda: all(reps[n].dormant is not None for n in names), what="asleep"
                )
                await sampled(names)  # read without waking them
                gc.collect()
                asleep = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            stats = node.summary("q1")
            assert stats["messages_ready"] == 10 and stats["publish_rate"] == 0.0
            assert all(reps[n].dormant is not None for n in names)

            def per_queue(snapshot: tracemalloc.Snapshot) -> float:
                return sum(s.size_diff for s in snapshot.compare_to(before, "filename")) / QUEUES

            return per_queue(after), per_queue(asleep)
        finally:
            await node.stop()

    awake, asleep = run(body())
    assert awake <= IDLE_REPLICA_BYTES_MAX, awake
    assert asleep <= SLEEPING_REPLICA_BYTES_MAX, asleep


WOKEN_TRACKED_OBJECTS_MAX = 60
"""Objects the garbage collector tracks for each queue a receive woke (what its machine,
Raft core, driver, log and lease hold): about 57 (65 before its lanes without warm pages,
its driver with nothing waiting on a write and its Raft log with nothing unstable shared
one empty list, its timer the context it runs in and the node's one bound callback, and
its pager held its machine instead of two bound methods). A restart with 10,000 sleeping queues wakes them all within
seconds, and every young and middle collection walks what they keep."""
WOKEN = 40


def test_a_woken_queue_keeps_few_objects_for_the_collector(tmp_path: Path) -> None:
    async def body() -> float:
        node = Node(tmp_path, limits=FAST)
        await node.start()
        for n in range(WOKEN + 1):
            await node.create_queue(f"q{n}", QueueArgs())
            await node.publish(f"q{n}", msgs(*[b"m" * 64] * 10))
        await node.stop()  # a clean stop: they start again asleep
        node = Node(tmp_path, limits=FAST)
        await node.start()
        try:
            reps = node.context.replicas
            assert all(rep.dormant is not None for rep in reps.values())

            async def receive(name: str) -> None:
                got = await node.receive(
                    name, consumer="c", max_messages=1, wait_ms=0, lease_ms=None
                )
                assert len(got) == 1

            await receive("q0")  # first uses (caches, the WAL writer) are not a queue's
            gc.collect()
            gc.freeze()  # what is tracked from here on is what the wakes keep
            try:
                for n in range(1, WOKEN + 1):
                    await receive(f"q{n}")
                gc.collect()
                kept = len(gc.get_objects())
            finally:
                gc.unfreeze()
            assert all(reps[f"q{n}"].dormant is None for n in range(1, WOKEN + 1))
            return kept / WOKEN
        finally:
            await node.stop()

    per_queue = run(body())
    assert per_queue <= WOKEN_TRACKED_OBJECTS_MAX, per_queue
