"""Snapshots shipped in chunks to a lagging follower (section 7), and ReadIndex reads
(section 6.4)."""

from __future__ import annotations

import dataclasses

from engine.raft.events import Propose, ReadIndex, Receive
from engine.raft.kv import encode_put
from engine.raft.messages import AppendRequest, AppendResponse, Heartbeat, SnapshotChunk
from engine.raft.snapshot import Snapshot
from tests.engine.raft.harness import LIMITS, Cluster, sid


def test_a_lagging_follower_is_installed_from_a_snapshot_in_chunks() -> None:
    limits = dataclasses.replace(LIMITS, snapshot_chunk_bytes=16)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    c.cut = {"c"}
    for n in range(6):
        c.step("a", Propose(n, (encode_put(f"k{n % 2}", b"v%d" % n),)))
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    snap = c.take_snapshot("a")
    assert snap.index == 7 and list(snap.live_indexes) == [6, 7]
    assert c.nodes["a"].storage.first_index() == 8
    c.cut = set()
    # a finds the pipeline to c stalled (what it lost stays lost), then sends the chunks
    c.tick(limits.append_stall_ms + 2 * limits.heartbeat_interval_ms, deliver=True)
    sent = [m for rd in c.nodes["a"].readies for m in rd.messages]
    chunks = sum(1 for m in sent if type(m) is SnapshotChunk)
    assert chunks > 2, "the snapshot went in several chunks"
    cnode = c.nodes["c"]
    assert cnode.raft.log.snapshot_index == 7 and cnode.raft.commit == 7
    assert cnode.machine.keys == {"k0": 6, "k1": 7}
    assert cnode.machine.get("k1", lambda i: cnode.storage.entry(i).data) == b"v5"
    c.step("a", Propose(9, (encode_put("k2", b"after"),)))
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    assert cnode.raft.applied == 8 and cnode.machine.keys["k2"] == 8


def test_a_snapshot_value_round_trips_through_bytes() -> None:
    c = Cluster(["a"])
    c.tick(c.limits.election_timeout_ms_max)
    c.step("a", Propose(1, (encode_put("k", b"v"),)))
    snap = c.take_snapshot("a")
    back = Snapshot.parse(snap.encode())
    assert back == snap


def test_read_index_answers_after_a_quorum_confirms_leadership() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    rd = c.step("a", ReadIndex(3))
    assert not rd.reads
    heartbeats = c.take(Heartbeat)
    assert len(heartbeats) == 2 and all(h.read_seq == 1 for h in heartbeats)
    c.deliver(heartbeats[:1])
    c.stabilize()
    reads = [r for rd in c.nodes["a"].readies for r in rd.reads]
    assert [(r.request_id, r.index) for r in reads] == [(3, 1)]


def test_read_index_is_refused_by_a_follower_and_waits_for_a_current_term_commit() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    rd = c.step("b", ReadIndex(4))
    assert [(r.reason, r.leader) for r in rd.rejected] == [("not_leader", "a")]
    c2 = Cluster(["a", "b", "c"])
    c2.tick(c2.limits.election_timeout_ms_max, ["a"])
    c2.deliver(c2.take())
    c2.deliver(c2.take())
    c2.deliver(c2.take())
    c2.deliver(c2.take())
    assert c2["a"].commit == 0
    rd = c2.step("a", ReadIndex(5))
    assert not rd.reads and not c2.take(Heartbeat)
    c2.stabilize()
    c2.stabilize()
    reads = [r for rd in c2.nodes["a"].readies for r in rd.reads]
    assert [(r.request_id, r.index) for r in reads] == [(5, 1)]


def test_a_read_is_rejected_when_leadership_is_lost_before_confirmation() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"b", "c"}
    c.step("a", ReadIndex(6))
    c.tick(2 * c.limits.election_timeout_ms_min + c.limits.tick_ms, ["a"], deliver=True)
    rejected = [r for rd in c.nodes["a"].readies for r in rd.rejected]
    assert [(r.request_id, r.reason) for r in rejected] == [(6, "lost_leadership")]


def test_a_follower_whose_log_holds_the_snapshot_point_keeps_its_log() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"c"}
    for n in range(3):
        c.step("a", Propose(n, (encode_put("k", b"%d" % n),)))
    c.deliver(c.take(AppendRequest, dst="b"))
    c.deliver(c.take(AppendResponse))
    b = c["b"]
    assert c["a"].commit == 4 and b.commit == 1 and b.log.last_index() == 4
    snap = c.take_snapshot("a")
    b.step(
        Receive(
            SnapshotChunk(
                src=sid("a"),
                dst=sid("b"),
                term=1,
                snapshot_index=snap.index,
                snapshot_term=snap.term,
                offset=0,
                data=b"",
                done=True,
            )
        )
    )
    rd = b.ready()
    assert rd.snapshot_to_install is None and b.log.last_index() == 4 and b.commit == 4
    assert [type(m).__name__ for m in rd.messages_after_persist] == ["SnapshotResponse"]
    assert [m.next_offset for m in rd.messages_after_persist] == [-1]
    assert [e.index for e in rd.committed_entries] == [2, 3, 4]
