"""A fourth node joins a running cluster of three real server processes with ``--join``,
takes a replica of a queue, serves it under the checker's load, and restarts as any node
does (issue 15, "add a fourth node with --join")."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.app.conftest import ROOT
from tests.cluster.checker import Checker
from tests.cluster.harness import HOST, Cluster

pytestmark = pytest.mark.integration

StartCluster = Callable[[int], Cluster]
WAIT_S = 30.0
REFUSED_S_MAX = 120.0
"""A refused join's whole run: start, handshake, the metadata's answer, exit."""


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.2)


def _nodes(cluster: Cluster, via: str) -> dict[str, dict[str, Any]]:
    response = cluster.client(via).get("/api/v1/cluster")
    return {} if response.status_code != 200 else {n["name"]: n for n in response.json()["nodes"]}


def _members(cluster: Cluster, queue: str, via: str) -> list[str]:
    raft = cluster.raft_stats(queue, via) or {}
    return sorted(m["node"] for m in raft.get("members", []))


def test_a_node_joins_takes_a_replica_serves_it_and_restarts(start_cluster: StartCluster) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("widened", replicas=2, lease_ms=2000)
    joined = cluster.join("n4", via="n2")
    assert "joined" in (joined.data_dir / "cluster.json").read_text()
    for via in ("n1", "n4"):
        _wait(f"n4 active as {via} sees it", lambda v=via: _nodes(cluster, v).get("n4", {}).get("state") == "active")  # type: ignore[misc]  # fmt: skip
    _wait("n4 connected to n1", lambda: _nodes(cluster, "n1")["n4"].get("connected") is True)
    # Through n4, which holds no replica yet: it serves the queue by forwarding.
    checker = Checker(queue, [cluster.endpoint("n4")]).start()
    try:
        checker.wait_confirmed(20, timeout_s=WAIT_S)
        added = cluster.client("n4").post(f"/api/v1/queues/{queue}/members", json={"node": "n4"})
        assert added.status_code == 200, added.text
        _wait("n4 a member", lambda: "n4" in _members(cluster, queue, "n4"))
        checker.wait_confirmed(checker.confirmed_count() + 20, timeout_s=WAIT_S)
        # Restarted without --join, as any node is: with its peers.
        joined.stop()
        joined.join = None
        joined.peers = {n: (HOST, cluster.nodes[n].cluster_port) for n in ("n1", "n2", "n3")}
        joined.start()
        checker.wait_confirmed(checker.confirmed_count() + 20, timeout_s=WAIT_S)
    finally:
        checker.stop()
    checker.check()
    assert "n4" in _members(cluster, queue, "n1")
    assert "n4" in cluster.output("n4") and "Cluster qc-" in cluster.output("n4")


def test_a_voter_that_lost_its_data_directory_is_refused_with_peers_or_join(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("everywhere", replicas=3)
    _wait("three members", lambda: len(_members(cluster, queue, "n1")) == 3)
    # n3 (a voter of the metadata and of the queue's group) loses its data directory and
    # comes back under its name and address: first as the founder it was, with --peers.
    node = cluster.nodes["n3"]
    cluster.kill9("n3")
    shutil.rmtree(node.data_dir)
    # Run to its end (it never serves): no readiness wait to time out on a loaded machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
    env["QUORRA_CLUSTER_SECRET"] = node.secret
    run = subprocess.run(
        node.command(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=REFUSED_S_MAX
    )
    assert run.returncode == 3, run.stderr
    assert "node n3 is refused by its cluster" in run.stderr, run.stderr
    assert "knows node n3 from another data directory" in run.stderr
    assert "/api/v1/cluster/nodes/n3/forget" in run.stderr
    # Then with --join, from an empty data directory again.
    shutil.rmtree(node.data_dir)
    node.peers = {}
    node.join = (HOST, cluster.nodes["n1"].cluster_port)
    run = subprocess.run(
        node.command(), cwd=ROOT, env=env, capture_output=True, text=True, timeout=REFUSED_S_MAX
    )
    assert run.returncode == 3, run.stderr
    assert "node n3 is already a member of this cluster" in run.stderr, run.stderr
    assert (
        "votes in the cluster's metadata and in the replica groups of 1 queues (everywhere)"
        in run.stderr
    )
    assert "/api/v1/cluster/nodes/n3/forget" in run.stderr
    assert not (node.data_dir / "cluster.json").exists()
    # The others serve on; n3 stays the member it was, down.
    published = cluster.client("n1").post(
        f"/api/v1/queues/{queue}/messages", json={"messages": [{"body": "x"}]}
    )
    assert published.status_code == 201, published.text
    assert _nodes(cluster, "n2")["n3"]["state"] == "active"
