"""A queue's stats asked on a node whose replica follows come from the queue's leader,
or are the follower's own, marked stale with their age, when the leader cannot answer
(issue 15: "each queue's stats from its leader, or marked stale with their age"). Three
real server processes on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.cluster.harness import Cluster

pytestmark = pytest.mark.integration

StartCluster = Callable[[int], Cluster]
QUEUE = "watched"
ANSWER_S_MAX = 5.0
"""A dead leader costs a stats call its short deadline (1 s), not a call deadline (30 s)."""


def _stats(cluster: Cluster, via: str) -> dict[str, Any]:
    answer = cluster.client(via).get(f"/api/v1/queues/{QUEUE}")
    assert answer.status_code == 200, answer.text
    stats: dict[str, Any] = answer.json()["stats"]
    return stats


def test_a_follower_shows_the_leaders_stats_or_its_own_marked_stale(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    cluster.create_queue(QUEUE, replicas=3)
    leader = cluster.leader(QUEUE)
    follower, other = sorted(n for n in cluster.live() if n != leader)
    body = {"messages": [{"body": f"m{k}"} for k in range(5)]}
    published = cluster.client(leader).post(f"/api/v1/queues/{QUEUE}/messages", json=body)
    assert published.status_code == 201, published.text
    cluster.wait_caught_up(QUEUE, follower)

    own = _stats(cluster, leader)
    assert "remote" not in own and own["status"] == "ok", own
    shown = _stats(cluster, follower)
    assert shown["remote"] == {"from_node": leader, "age_ms": 0}, shown
    assert shown["status"] == "ok" and shown["messages_ready"] == 5, shown
    # The leader's view of its followers' progress, which a follower does not have.
    lags = {m["node"]: m["lag"] for m in shown["raft"]["members"]}
    assert lags == {m["node"]: m["lag"] for m in own["raft"]["members"]}, (shown, own)

    time.sleep(1.0)  # the commit index reaches the followers with the next heartbeat
    cluster.kill9(leader)
    cluster.kill9(other)
    started = time.monotonic()
    stale = _stats(cluster, follower)
    took = time.monotonic() - started
    assert stale["status"] == "stale", stale
    assert stale["remote"]["from_node"] == follower, stale
    assert isinstance(stale["remote"]["age_ms"], int) and stale["remote"]["age_ms"] >= 0, stale
    assert stale["messages_ready"] == 5, stale
    assert took < ANSWER_S_MAX, f"a stats call to a dead leader took {took:.1f} s"
