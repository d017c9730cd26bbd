"""A scrape of the per-queue metrics holds each queue's figures, not its stats: with
thousands of queues, their stats held until the last family was written raised the
server's peak RSS by about 10 KB a queue, and part of it stayed."""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import cast

from app.queue_metrics import QueueCollector
from engine.runtime.api import QueueEngine

QUEUES = 50


class _Stats(dict[str, object]):
    """A queue's stats that a weak reference can follow."""


class _Node:
    """The two calls the queue families make of a node; counts the stats alive."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[_Stats]] = []

    def alive(self) -> int:
        return sum(1 for ref in self.refs if ref() is not None)

    def queues(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=f"q{k:02d}") for k in range(QUEUES)]

    def stats(self, name: str) -> _Stats:
        k = int(name[1:])
        # Every other queue lacks its raft section: its raft series are left out.
        raft = {"term": 3, "commit_index": 10 + k} if k % 2 == 0 else None
        stats = _Stats(messages_ready=k, published=2 * k)
        if raft is not None:
            stats["raft"] = raft
        self.refs.append(weakref.ref(stats))
        return stats


def test_a_scrape_keeps_figures_not_stats() -> None:
    node = _Node()
    families = QueueCollector(lambda: cast(QueueEngine, node)).collect()
    by_name = {}
    for family in families:
        # Every queue's stats were read before the first family: none is held.
        assert node.alive() == 0
        by_name[family.name] = family
        if family.name == "quorra_queue_messages_published":
            break
    ready = by_name["quorra_queue_messages_ready"].samples
    assert [(s.labels["queue"], s.value) for s in ready] == [
        (f"q{k:02d}", float(k)) for k in range(QUEUES)
    ]
    commits = by_name["quorra_queue_raft_commit_index"].samples
    assert [(s.labels["queue"], s.value) for s in commits] == [
        (f"q{k:02d}", float(10 + k)) for k in range(0, QUEUES, 2)
    ]
    assert by_name["quorra_queue_memory_bytes"].samples == []
    published = by_name["quorra_queue_messages_published"].samples
    assert [s.value for s in published] == [float(2 * k) for k in range(QUEUES)]
