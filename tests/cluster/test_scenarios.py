"""The scenarios of issue 15 on a cluster of three real server processes, each under the
checker's steady load (``checker.py``): a failure happens, the cluster serves again, and
every confirmed message is consumed at least once, nothing else.

They need the TCP transport (``engine.runtime.tcp_transport``) and the cluster flags of
``quorra serve``; until the transport can be imported they are skipped.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

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
