"""A node writes its follower copies' segments past the page cache: nothing reads them
while it follows; the leader's stay cached for its consumers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.runtime import InMemoryNetwork
from engine.runtime.api import QueueArgs
from engine.storage.segment import HEAD_READ_BYTES, segment_info_of
from tests.engine.runtime.test_cluster import NAMES, cluster, leader_name, leader_of, retrying
from tests.engine.runtime.util import eventually, msgs, rolling, run
from tests.engine.storage.pagecache import resident


def segments(root: Path) -> list[Path]:
    """The node's segment files of at least 64 KiB (the queue's, not the small ones of
    the cluster's own group)."""
    return [p for p in root.glob("queues/*/segments/*.seg") if p.stat().st_size >= 64 * 1024]


def test_followers_segments_leave_the_page_cache_and_the_leaders_stay(tmp_path: Path) -> None:
    limits = rolling(wal_file_bytes_max=256 * 1024)

    async def body() -> None:
        network = InMemoryNetwork(NAMES)
        nodes = await cluster(tmp_path, network, limits)
        try:
            await nodes["n1"].create_queue("fq", QueueArgs())
            leader = await retrying(lambda: leader_name(nodes, "fq"))
            for _ in range(40):
                batch = [os.urandom(8 * 1024) for _ in range(8)]
                await retrying(lambda b=batch: nodes[leader].publish("fq", msgs(*b)))  # type: ignore[misc]
            await eventually(
                lambda: all(len(segments(tmp_path / n)) >= 2 for n in NAMES), what="segments"
            )
            if leader_of(nodes, "fq") != leader:
                pytest.skip("the queue's leadership moved during the test")
            for name in NAMES:
                payload_pages = resident_pages = 0
                for path in segments(tmp_path / name):
                    pages = resident(path)  # before reading the header, which reads page 0
                    with path.open("rb") as f:
                        info = segment_info_of(str(path), f.read(HEAD_READ_BYTES))
                    head = info.data_offset // 4096 + 1
                    assert all(pages[:head]), (name, path)
                    if name == leader:
                        assert all(pages), (name, path, pages)
                    payload_pages += len(pages) - head
                    resident_pages += sum(pages[head:])
                if name != leader:
                    # A follower that applies an entry after its flush reads it back from
                    # the segment (its commit index comes with the next append): those
                    # pages return to the cache; the rest stay out of it.
                    assert resident_pages <= payload_pages // 4, (
                        name,
                        resident_pages,
                        payload_pages,
                    )
        finally:
            for node in nodes.values():
                await node.stop()

    run(body())
