"""The metadata group heartbeats ``Limits.meta_heartbeat_intervals`` times less often
than a queue's group (most of an idle cluster's CPU went to its heartbeats), with the
queues' election timeout: an idle cluster sends that many times fewer messages, and a
lost metadata leader is replaced as before. Three nodes in one process, in-memory
transport."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.server import Role
from engine.runtime import InMemoryNetwork
from engine.runtime.meta_group import meta_raft_limits
from tests.engine.runtime.test_meta_group import LIMITS, NAMES, group, node_on, stop_all
from tests.engine.runtime.util import eventually, run

WINDOW_S = 1.5


def test_the_metadata_core_heartbeats_less_often_with_the_same_timeouts() -> None:
    meta = meta_raft_limits(DEFAULT_LIMITS)
    assert meta.heartbeat_interval_ms == 2 * DEFAULT_LIMITS.heartbeat_interval_ms
    assert meta.election_timeout_ms_min == DEFAULT_LIMITS.election_timeout_ms_min
    assert meta.election_timeout_ms_max == DEFAULT_LIMITS.election_timeout_ms_max
    # Two heartbeats must fit in the shortest election timeout, or a follower of an
    # idle metadata leader would call elections: such limits are refused.
    with pytest.raises(AssertionError):
        dataclasses.replace(DEFAULT_LIMITS, meta_heartbeat_intervals=3)


async def _idle_messages(root: Path, limits: Limits) -> tuple[int, float]:
    """Raft messages sent in ``WINDOW_S`` by three idle nodes (no queue); and how long a
    new metadata leader took once the old one was cut off."""
    network = InMemoryNetwork(NAMES)
    nodes = {name: node_on(root, name, network, limits) for name in NAMES}
    await asyncio.gather(*(n.start() for n in nodes.values()))
    try:
        await eventually(lambda: all(group(n).caught_up() for n in nodes.values()))
        await eventually(
            lambda: all(r.incarnation for r in group(nodes["n1"]).machine.nodes.values()),
            what="the nodes' reports",
        )
        before = network.messages_sent
        await asyncio.sleep(WINDOW_S)
        sent = network.messages_sent - before
        old = next(n for n, node in nodes.items() if group(node).raft.role is Role.LEADER)
        loop = asyncio.get_running_loop()
        cut_at = loop.time()
        network.isolate(old)
        others = [nodes[n] for n in NAMES if n != old]
        await eventually(lambda: any(group(n).raft.role is Role.LEADER for n in others))
        return sent, loop.time() - cut_at
    finally:
        await stop_all(nodes)


def test_an_idle_cluster_sends_fewer_metadata_messages_and_fails_over_as_soon(
    tmp_path: Path,
) -> None:
    every_time = dataclasses.replace(LIMITS, meta_heartbeat_intervals=1)
    before, _ = run(_idle_messages(tmp_path / "before", every_time))
    after, failover_s = run(_idle_messages(tmp_path / "after", LIMITS))
    assert LIMITS.meta_heartbeat_intervals == 2
    # A heartbeat and its reply per follower per interval; 30 ms then 60 ms here.
    assert after < 0.7 * before, (before, after)
    # The old leader was cut off right after a heartbeat at worst: the others elect
    # within an election timeout and a round of votes (slack for a loaded machine).
    assert failover_s < 3 * LIMITS.election_timeout_ms_max / 1000, failover_s
