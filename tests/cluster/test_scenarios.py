"""The scenarios of issue 15 on a cluster of three real server processes, each under the
checker's steady load (``checker.py``): a failure happens, the cluster serves again, and
every confirmed message is consumed at least once, nothing else.

They need the TCP transport (``engine.runtime.tcp_transport``) and the cluster flags of
``quorra serve``; until the transport can be imported they are skipped.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.cluster.checker import Checker
from tests.cluster.harness import Cluster


def _transport_importable() -> bool:
    try:
        importlib.import_module("engine.runtime.tcp_transport")
    except ImportError:
        return False
    return True


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not _transport_importable(),
        reason="needs the TCP transport of issue 15 (engine.runtime.tcp_transport)",
    ),
]

StartCluster = Callable[[int], Cluster]
FAILOVER_S_MAX = 5.0
"""From the kill to the first publishes confirmed again. ``quorra bench cluster`` measures
the target (a median under 1 s); this bound only fails a cluster that does not fail over,
or does so far too slowly, on a loaded test machine."""


def test_kill9_the_leader_a_new_leader_serves_and_the_old_one_catches_up(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("failover", replicas=3, lease_ms=2000)
    old = cluster.leader(queue)
    checker = Checker(queue, cluster.endpoints()).start()
    try:
        checker.wait_confirmed(50)
        cluster.kill9(old)
        killed_at = time.monotonic()
        new = cluster.leader(queue, excluding=[old])
        served_at = checker.wait_confirmed(checker.confirmed_count() + 1)
        assert served_at - killed_at < FAILOVER_S_MAX
        checker.wait_confirmed(checker.confirmed_count() + 50)
        cluster.restart(old)
        cluster.wait_caught_up(queue, old)
        assert cluster.leader(queue) in {new, old}
        checker.wait_confirmed(checker.confirmed_count() + 50)
    finally:
        checker.stop()
    checker.check()


MINORITY_S_MAX = 8.0
"""From the cut to the old leader refusing: its check-quorum steps it down after an
election timeout, then a publish there waits ``leader_wait_ms`` for a leader it cannot
see; on a loaded test machine both take longer than their nominal 0.6 s + 3 s."""


def _refused_at(cluster: Cluster, node: str, queue: str, checker: Checker) -> float:
    """Publish through ``node`` until it refuses (503): when it did. Each probe is
    attempted in the checker's eyes: its outcome is unknown until it is refused."""
    client = cluster.client(node)
    deadline = time.monotonic() + 2 * MINORITY_S_MAX
    k = 0
    while time.monotonic() < deadline:
        k += 1
        body = f"probe-{checker.run}-{k}"
        checker.attempted.add(body)
        message = {"body": body, "dedup_id": body}
        try:
            answer = client.post(
                f"/api/v1/queues/{queue}/messages", json={"messages": [message]}, timeout=15
            )
        except httpx.TransportError:
            continue
        if answer.status_code == 503:
            return time.monotonic()
    raise AssertionError(f"{node} went on confirming while cut off from the majority")


def test_a_leader_cut_off_in_the_minority_stops_confirming_and_rejoins(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(3)
    queue = cluster.create_queue("minority", replicas=3, lease_ms=2000)
    old = cluster.leader(queue)
    majority = [n for n in cluster.names if n != old]
    cluster.token(old)  # a node cut off from the metadata's majority mints no token
    checker = Checker(queue, [cluster.endpoint(n) for n in majority]).start()
    try:
        checker.wait_confirmed(30)
        cluster.partition([old], majority)
        cut_at = time.monotonic()
        assert _refused_at(cluster, old, queue, checker) - cut_at < MINORITY_S_MAX
        cluster.leader(queue, excluding=[old])
        checker.wait_confirmed(checker.confirmed_count() + 50)
        cluster.heal()
        cluster.wait_caught_up(queue, old)
        checker.wait_confirmed(checker.confirmed_count() + 30)
    finally:
        checker.stop()
    checker.check()


def test_one_way_partition_delay_and_frame_loss(start_cluster: StartCluster) -> None:
    """Each fault in turn under load, the cluster confirming through all of them."""
    cluster = start_cluster(3)
    queue = cluster.create_queue("lossy", replicas=3, lease_ms=3000)
    leader = cluster.leader(queue)
    follower = next(n for n in cluster.names if n != leader)
    checker = Checker(queue, cluster.endpoints()).start()
    try:
        checker.wait_confirmed(30)
        cluster.one_way(leader, follower)
        checker.wait_confirmed(checker.confirmed_count() + 30)
        cluster.heal()
        cluster.delay(200)
        checker.wait_confirmed(checker.confirmed_count() + 30, timeout_s=40)
        cluster.heal()
        cluster.loss(0.05, seed=15)
        checker.wait_confirmed(checker.confirmed_count() + 30, timeout_s=40)
        cluster.heal()
        checker.wait_confirmed(checker.confirmed_count() + 30)
    finally:
        checker.stop()
    checker.check()


def test_strangers_and_a_node_with_the_wrong_secret_change_nothing(
    start_cluster: StartCluster,
) -> None:
    """Garbage on a cluster port closes that connection only; a node restarted with
    another secret is refused by its peers (and says why), and the others serve on."""
    cluster = start_cluster(3)
    queue = cluster.create_queue("guarded", replicas=3)
    checker = Checker(queue, [cluster.endpoint("n1"), cluster.endpoint("n2")]).start()
    try:
        checker.wait_confirmed(20)
        for junk in (b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff" + b"x" * 64, os.urandom(4096)):
            with socket.create_connection(("127.0.0.1", cluster.nodes["n1"].cluster_port)) as s:
                s.settimeout(5)
                with contextlib.suppress(OSError):
                    s.sendall(junk)
                    while s.recv(4096):
                        pass  # the node answers a refusal, then closes
        checker.wait_confirmed(checker.confirmed_count() + 20)
        n3 = cluster.nodes["n3"]
        n3.stop()
        n3.secret = "another-secret-of-enough-bytes"
        # Refused by both peers it never sees the metadata: it turns ready after this wait.
        n3.env["QUORRA_METADATA_MIRROR_WAIT_MS"] = "500"
        cluster.restart("n3")
        checker.wait_confirmed(checker.confirmed_count() + 20)
        # n1 names the reason: of its attempts, each refused, some may end otherwise
        # (reset by the back-off of the other side) before a refusal names it.
        deadline = time.monotonic() + 10
        while True:
            n3_seen = _cluster_nodes(cluster, "n1")["n3"]
            assert n3_seen["connected"] is False and n3_seen["health"] == "down", n3_seen
            if "bad MAC" in str(n3_seen["last_error"]) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert "failed to prove the cluster secret" in str(n3_seen["last_error"]), n3_seen
    finally:
        checker.stop()
    checker.check()


def _cluster_nodes(cluster: Cluster, via: str) -> dict[str, dict[str, Any]]:
    nodes = cluster.client(via).get("/api/v1/cluster").json()["nodes"]
    return {n["name"]: n for n in nodes}
