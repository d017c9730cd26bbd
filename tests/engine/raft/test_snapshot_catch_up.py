"""A snapshot is a checkpoint plus the live entries before it: a restart reads none of
them, and a lagging follower receives the checkpoint, says which live entries it lacks,
and gets only those, in bounded messages read from the leader's log."""

from __future__ import annotations

import dataclasses

from pyroaring import BitMap64

from engine.raft.events import Propose, Receive
from engine.raft.kv import encode_put
from engine.raft.messages import SnapshotChunk, SnapshotResponse
from tests.engine.raft.harness import LIMITS, Cluster


def _put(c: Cluster, name: str, n: int) -> None:
    c.step(name, Propose(n, (encode_put(f"k{n}", b"v%d" % n),)))


def test_a_lagging_follower_gets_the_checkpoint_then_only_the_live_entries_it_lacks() -> None:
    limits = dataclasses.replace(LIMITS, snapshot_chunk_bytes=16, append_entries_per_message_max=2)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    for n in range(3):
        _put(c, "a", n)
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    assert c["c"].commit == 4
    c.cut = {"c"}
    for n in range(3, 7):
        _put(c, "a", n)
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    snap = c.take_snapshot("a")
    assert snap.index == 8 and list(snap.live_indexes) == [2, 3, 4, 5, 6, 7, 8]
    reads_before = c.nodes["a"].storage.entry_reads
    c.cut = set()
    c.tick(6 * limits.heartbeat_interval_ms, deliver=True)
    to_c = [
        m
        for rd in c.nodes["a"].readies
        for m in rd.messages
        if type(m) is SnapshotChunk and m.dst == "c"
    ]
    pieces = [m for m in to_c if not m.entries]
    carried = [e.index for m in to_c for e in m.entries]
    assert len(pieces) > 2 and all(len(m.data) <= 16 for m in pieces)
    assert carried == [5, 6, 7, 8], "only what c lacked, once each"
    assert all(len(m.entries) <= 2 for m in to_c)
    assert c.nodes["a"].storage.entry_reads - reads_before == 4
    answers = [
        m
        for rd in c.nodes["c"].readies
        for m in rd.messages_after_persist
        if type(m) is SnapshotResponse and m.missing
    ]
    assert [BitMap64.deserialize(m.missing) for m in answers] == [BitMap64([5, 6, 7, 8])]
    cnode = c.nodes["c"]
    installs = [rd for rd in cnode.readies if rd.snapshot_to_install is not None]
    assert len(installs) == 1 and [e.index for e in installs[0].snapshot_entries] == [5, 6, 7, 8]
    assert cnode.raft.log.snapshot_index == 8 and cnode.raft.commit == 8
    assert cnode.machine.keys == {f"k{n}": n + 2 for n in range(7)}
    for n in range(7):
        assert cnode.storage.entry(n + 2) == c.nodes["a"].storage.entry(n + 2)
    _put(c, "a", 7)
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    assert cnode.raft.applied == 9 and cnode.machine.keys["k7"] == 9


def test_a_new_follower_gets_every_live_entry() -> None:
    limits = dataclasses.replace(LIMITS, append_entries_per_message_max=3)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    c.cut = {"c"}
    for n in range(5):
        _put(c, "a", n)
    c.stabilize()
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    c.take_snapshot("a")
    c.cut = set()
    c.tick(limits.append_stall_ms + 4 * limits.heartbeat_interval_ms, deliver=True)
    installs = [rd for rd in c.nodes["c"].readies if rd.snapshot_to_install is not None]
    assert [e.index for e in installs[0].snapshot_entries] == [2, 3, 4, 5, 6]
    assert c.nodes["c"].machine.keys == c.nodes["a"].machine.keys


def test_a_restart_after_a_snapshot_reads_no_live_entry() -> None:
    c = Cluster(["a"])
    c.tick(c.limits.election_timeout_ms_max)
    for n in range(50):
        _put(c, "a", n)
    snap = c.take_snapshot("a")
    assert len(snap.live_indexes) == 50
    for n in range(50, 53):
        _put(c, "a", n)
    storage = c.nodes["a"].storage
    reads = storage.entry_reads
    c.restart("a")
    a = c.nodes["a"]
    assert storage.entry_reads == reads, "no live payload read at restart"
    assert a.raft.snapshot is None and a.raft.log.snapshot_index == snap.index
    replayed = [e.index for rd in a.readies for e in rd.committed_entries]
    assert replayed == [snap.index + 1, snap.index + 2, snap.index + 3]
    assert a.machine.keys == {f"k{n}": n + 2 for n in range(53)}


def test_a_follower_refuses_live_entries_it_did_not_ask_for_and_says_again_what_it_lacks() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    for n in range(3):
        _put(c, "a", n)
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.cut = {"c"}
    for n in range(3, 7):
        _put(c, "a", n)
    c.stabilize()
    snap = c.take_snapshot("a")
    data = snap.encode()
    a, f = c["a"], c["c"]
    stored = c.nodes["a"].storage

    def send(offset: int, piece: bytes, done: bool, indexes: list[int]) -> SnapshotResponse:
        entries = [stored.entry(i) for i in indexes]
        chunk = SnapshotChunk(
            src=a.id,
            dst=f.id,
            term=a.term,
            snapshot_index=snap.index,
            snapshot_term=snap.term,
            offset=offset,
            data=piece,
            done=done,
            entries=entries,
        )
        f.step(Receive(chunk))
        (resp,) = f.ready().messages_after_persist
        assert isinstance(resp, SnapshotResponse)
        return resp

    first = send(0, data, True, [])
    assert first.next_offset == len(data)
    assert BitMap64.deserialize(first.missing) == BitMap64([5, 6, 7, 8])
    wrong = send(len(data), b"", False, [6, 7])
    assert wrong.next_offset == len(data) and wrong.missing == first.missing
    ok = send(len(data), b"", False, [5, 6])
    assert ok.next_offset == len(data) + 2 and ok.missing == b""
    f.step(
        Receive(
            SnapshotChunk(
                src=a.id,
                dst=f.id,
                term=a.term,
                snapshot_index=snap.index,
                snapshot_term=snap.term,
                offset=len(data) + 2,
                data=b"",
                done=True,
                entries=[stored.entry(7), stored.entry(8)],
            )
        )
    )
    rd = f.ready()
    assert rd.snapshot_to_install == snap
    assert [e.index for e in rd.snapshot_entries] == [5, 6, 7, 8]
    assert [m.next_offset for m in rd.messages_after_persist] == [-1]
