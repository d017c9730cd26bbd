"""Draining and forgetting a node, on a cluster of three real server processes under the
checker's steady load: the node's leaderships and replicas move to the other nodes, one
change at a time per queue, and every confirmed message is consumed (issue 15,
"Placement and membership")."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.app.test_ui import csrf_of, log_in
from tests.cluster.checker import Checker
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.integration

StartCluster = Callable[[int], Cluster]
MOVE_S_MAX = 30.0
"""From the drain's answer to the node holding no replica (a learner's catch-up and two
membership changes per queue, on a loaded test machine)."""


def _node(cluster: Cluster, via: str, name: str) -> dict[str, Any]:
    nodes = cluster.client(via).get("/api/v1/cluster").json()["nodes"]
    entry: dict[str, Any] = next(n for n in nodes if n["name"] == name)
    return entry


def _members(cluster: Cluster, queue: str, via: str) -> list[str]:
    raft = cluster.raft_stats(queue, via) or {}
    return sorted(m["node"] for m in raft.get("members", []))


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = MOVE_S_MAX) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.2)


def test_drain_moves_leaderships_and_replicas_off_a_node(start_cluster: StartCluster) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("drained", replicas=2, lease_ms=2000)
    leader = cluster.leader(queue)
    other = next(n for n in _members(cluster, queue, leader) if n != leader)
    refused = cluster.client(other).post("/api/v1/cluster/nodes/nobody/drain")
    assert refused.status_code == 404, refused.text
    # Through the member that stays.
    checker = Checker(queue, [cluster.endpoint(other)]).start()
    try:
        checker.wait_confirmed(30)
        answer = cluster.client(other).post(f"/api/v1/cluster/nodes/{leader}/drain")
        assert answer.status_code == 202, answer.text
        assert answer.json()["state"] == "draining"
        _wait(
            f"{leader} holding no replica", lambda: _node(cluster, other, leader)["replicas"] == []
        )
        checker.wait_confirmed(checker.confirmed_count() + 30)
    finally:
        checker.stop()
    checker.check()
    members = _members(cluster, queue, other)
    assert leader not in members and len(members) == 2, members
    assert cluster.leader(queue) != leader
    again = cluster.client(leader).post(f"/api/v1/cluster/nodes/{leader}/drain")
    assert again.status_code == 202 and again.json()["replicas"] == [], again.text
    # A new queue places nothing on the draining node.
    fresh = cluster.create_queue("fresh", via=other, replicas=2)
    _wait("the new queue's two members", lambda: len(_members(cluster, fresh, other)) == 2)
    assert leader not in _members(cluster, fresh, other)


def test_forget_replaces_a_dead_nodes_replicas_and_refuses_it_afterwards(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("kept", replicas=3, lease_ms=2000)
    leader = cluster.leader(queue)
    dead, survivor = [n for n in cluster.names if n != leader]
    checker = Checker(queue, [cluster.endpoint(leader), cluster.endpoint(survivor)]).start()
    try:
        checker.wait_confirmed(30)
        cluster.kill9(dead)
        # The operator forgets it on the dashboard of a survivor.
        with httpx.Client(base_url=cluster.url(survivor), timeout=10.0) as browser:
            assert log_in(browser).status_code == 303
            page = browser.get("/cluster")
            assert ">Drain</button>" in page.text
            forgot = browser.post(
                f"/cluster/nodes/{dead}/forget", headers={"X-CSRF-Token": csrf_of(page)}
            )
            assert forgot.status_code == 200 and "lost" in forgot.text, forgot.text
        _wait(f"{dead} forgotten", lambda: _node(cluster, survivor, dead)["state"] == "forgotten")
        checker.wait_confirmed(checker.confirmed_count() + 30)
    finally:
        checker.stop()
    checker.check()
    assert _members(cluster, queue, survivor) == sorted([leader, survivor])
    again = cluster.client(survivor).post(f"/api/v1/cluster/nodes/{dead}/drain")
    assert again.status_code == 409, again.text
    # Back on its old data directory, it learns it was forgotten and exits (status 3).
    with contextlib.suppress(AssertionError):  # it may exit before it is ready
        cluster.restart(dead)
    proc = cluster.nodes[dead].proc
    assert proc is not None
    assert proc.wait(MOVE_S_MAX) == 3
    assert f"node {dead} was forgotten by its cluster" in cluster.output(dead)
