"""A restart replays the committed tail in bounded steps: no ``Ready`` hands out more
committed entries (or bytes, beyond one entry) than the limits allow."""

from __future__ import annotations

import dataclasses

from engine.raft.events import Propose
from engine.raft.kv import encode_put
from tests.engine.raft.harness import LIMITS, Cluster


def test_replay_after_a_restart_is_bounded_per_ready() -> None:
    limits = dataclasses.replace(LIMITS, committed_entries_per_ready_max=3)
    c = Cluster(["a"], limits=limits)
    c.tick(limits.election_timeout_ms_max)
    for n in range(10):
        c.step("a", Propose(n, (encode_put(f"k{n}", b"v%d" % n),)))
    assert c["a"].applied == 11
    c.restart("a")
    node = c.nodes["a"]
    sizes = [len(rd.committed_entries) for rd in node.readies if rd.committed_entries]
    assert node.raft.applied == 11 and sum(sizes) == 11
    assert max(sizes) == 3 and len(sizes) == 4
    assert node.machine.keys == {f"k{n}": n + 2 for n in range(10)}


def test_a_ready_stops_at_the_byte_bound_but_hands_out_at_least_one_entry() -> None:
    limits = dataclasses.replace(
        LIMITS, committed_bytes_per_ready_max=LIMITS.append_bytes_per_message_max
    )
    c = Cluster(["a"], limits=limits)
    c.tick(limits.election_timeout_ms_max)
    big = b"x" * (limits.committed_bytes_per_ready_max // 2 + 1)
    for n in range(3):
        c.step("a", Propose(n, (encode_put(f"k{n}", big),)))
    c.restart("a")
    sizes = [len(rd.committed_entries) for rd in c.nodes["a"].readies if rd.committed_entries]
    assert c["a"].applied == 4 and sizes == [2, 1, 1]
