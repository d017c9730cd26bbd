"""A node pages its queues' ready indexes (``engine.runtime.paging``), against real files:
read-ahead runs as a job so that a steady consumer never waits on a page load, the
node's budget bounds the pages in memory over every queue, and a deleted queue gives its
pages back."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import engine.queue.snapshots as snapshots_module
import engine.runtime.paging as paging_module
from engine.queue.snapshots import inline_snapshot, page_handles_of
from engine.runtime import InMemoryNetwork, Node
from engine.runtime.api import OutgoingMessage, QueueArgs
from tests.engine.runtime.test_cluster import NAMES, cluster, leader_name, retrying
from tests.engine.runtime.util import FAST, eventually, msgs, rolling, run, started

PAGE_REFS = 64
PAGED = dataclasses.replace(
    FAST,
    page_refs=PAGE_REFS,
    paged_index_bytes_per_queue_max=8 * PAGE_REFS * 8,
    paged_index_bytes_per_node_max=8 * PAGE_REFS * 8,
    page_read_ahead=4,
)
"""Pages of 64 messages; 8 in memory per queue and per node; 4 (256 messages) read
ahead."""


async def fill(node: Node, name: str, count: int) -> None:
    await node.create_queue(name, QueueArgs())
    for start in range(0, count, 500):
        batch = [OutgoingMessage(body=f"{name}{k}".encode()) for k in range(start, start + 500)]
        await node.publish(name, batch)


def paging(node: Node, name: str) -> dict[str, Any]:
    stats = node.stats(name)["paging"]
    assert isinstance(stats, dict)
    return stats


def test_a_steady_consumer_never_waits_on_a_page_load(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path, PAGED)
        try:
            await fill(node, "deep", 5000)
            assert paging(node, "deep")["paged_out_pages"] >= 5000 // PAGE_REFS - 8
            bodies: list[bytes] = []
            while len(bodies) < 5000:
                got = await node.receive(
                    "deep", consumer="c", max_messages=50, wait_ms=0, lease_ms=None
                )
                bodies += [m.body for m in got]
                await node.ack("deep", [m.receipt for m in got])
                await asyncio.sleep(0.005)  # a consumer's own work between receives
            assert bodies == [f"deep{k}".encode() for k in range(5000)]
            done = paging(node, "deep")
            assert done["page_waits"] == 0, done
            assert done["read_ahead_hits"] >= 5000 // PAGE_REFS - 8
            assert done["paged_out_pages"] == 0
        finally:
            await node.stop()

    run(body())


def test_the_node_budget_bounds_the_pages_in_memory_over_its_queues(tmp_path: Path) -> None:
    async def body() -> None:
        node = await started(tmp_path, PAGED)
        try:
            for name in ("a", "b", "c"):
                await fill(node, name, 3000)
            memory = node.memory()
            assert memory["resident_pages_max"] == 8 and memory["queues"] == 3
            # Each queue keeps its main lane's head and tail pages (6 in all) whatever
            # the budget; the others were spilled to stay within the node's 8.
            assert 6 <= memory["resident_pages"] <= 8  # type: ignore[operator]
            out = sum(paging(node, name)["paged_out_pages"] for name in ("a", "b", "c"))
            assert memory["paged_out_pages"] == out >= 3 * (3000 // PAGE_REFS) - 8
            await node.delete_queue("c")
            after = node.memory()
            assert after["queues"] == 2
            kept = sum(paging(node, name)["paged_out_pages"] for name in ("a", "b"))
            assert after["paged_out_pages"] == kept < out
        finally:
            await node.stop()

    run(body())


def test_a_follower_behind_a_snapshot_naming_pages_is_sent_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's snapshot names page files of its own; the follower it is sent to
    gets every page in it (``Pages.sendable``) and delivers the same messages. The pages
    are read into the snapshot by a worker, never on the loop."""
    inlined_in: list[threading.Thread] = []

    def inline(state: bytes, load: Callable[[int], bytes]) -> bytes:
        inlined_in.append(threading.current_thread())
        return inline_snapshot(state, load)

    monkeypatch.setattr(paging_module, "inline_snapshot", inline)
    limits = rolling(
        checkpoint_bytes_min=4096,
        page_refs=PAGE_REFS,
        paged_index_bytes_per_queue_max=4 * PAGE_REFS * 8,
        paged_index_bytes_per_node_max=8 * PAGE_REFS * 8,
        page_read_ahead=1,
    )
    keep = [f"keep-{k}" for k in range(2000)]

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network, limits)
        try:
            await nodes["n1"].create_queue("lag", QueueArgs(priorities=2))
            leader = await retrying(lambda: leader_name(nodes, "lag"))
            behind = next(name for name in NAMES if name != leader)
            network.isolate(behind)
            via = nodes[leader]
            for start in range(0, len(keep), 500):
                await retrying(lambda s=start: via.publish("lag", msgs(*keep[s : s + 500])))  # type: ignore[misc]
            # Churn at the higher priority: dead entries ask for checkpoints, which name
            # the low lane's pages, and compaction makes one of them the snapshot.
            for k in range(70):
                big = [f"{k}-{i}".ljust(4000, ".") for i in range(10)]
                await retrying(lambda b=big: via.publish("lag", msgs(*b, priority=1)))  # type: ignore[misc]
                got = await via.receive(
                    "lag", consumer="c", max_messages=10, wait_ms=0, lease_ms=None
                )
                assert all(m.priority == 1 for m in got)
                await via.ack("lag", [m.receipt for m in got])
            uid = via.context.replicas["lag"].uid
            snapshot = via.context.storage.checkpoints(uid).read_snapshot()
            assert snapshot is not None and page_handles_of(bytes(snapshot.state))
            network.heal(behind)
            await eventually(
                lambda: nodes[behind].stats("lag")["messages_ready"] == len(keep),
                timeout_s=30,
                what="the lagging follower caught up",
            )
            assert nodes[leader].context.replicas["lag"].raft.snapshot is not None
            rep = nodes[behind].context.replicas["lag"]
            ops = nodes[behind].context.ops
            first = ops.browse_local(rep, None, 1000)
            browsed = first + ops.browse_local(rep, first[-1].cursor, 1000)
            assert [m.body.decode() for m in browsed] == keep
            # Its pages came in the snapshot, not rebuilt from a log that lacks them.
            assert nodes[behind].stats("lag")["paging"]["pages_rebuilt"] == 0  # type: ignore[index]
            assert inlined_in and threading.main_thread() not in inlined_in
        finally:
            await asyncio.gather(*(n.stop() for n in nodes.values()))

    run(body(), timeout_s=120)


def test_a_restart_reads_a_paged_checkpoint_once_without_copying_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page files and the machine share one reading of the checkpoint's snapshot (at
    50 million messages it names 12,000 stored pages), taken on the path that makes the
    held refs views of the file, not msgpack's copies; every message is still there."""

    async def body() -> None:
        node = await started(tmp_path, PAGED)
        await fill(node, "deep", 3000)
        assert paging(node, "deep")["paged_out_pages"] > 0
        await node.checkpoint("deep")
        await node.stop()
        reads: list[bool] = []
        fast = snapshots_module._read_with_views

        def counted(data: bytes) -> list[Any]:
            try:
                state = fast(data)
            except Exception:
                reads.append(False)
                raise
            reads.append(True)
            return state

        monkeypatch.setattr(snapshots_module, "_read_with_views", counted)
        node = await started(tmp_path, PAGED)
        try:
            assert reads == [True]
            monkeypatch.undo()
            bodies: list[bytes] = []
            while len(bodies) < 3000:
                got = await node.receive(
                    "deep", consumer="c", max_messages=500, wait_ms=0, lease_ms=None
                )
                bodies += [m.body for m in got]
                await node.ack("deep", [m.receipt for m in got])
            assert bodies == [f"deep{k}".encode() for k in range(3000)]
        finally:
            await node.stop()

    run(body())
