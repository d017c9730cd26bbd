"""``RaftServer.check_invariants`` and ``RaftServer.next_deadline_ms``."""

from __future__ import annotations

import pytest

from engine.raft.events import AddServer, Propose, ReadIndex, Tick, TransferLeadership
from engine.raft.messages import Heartbeat, VoteRequest
from engine.raft.progress import Progress
from engine.raft.server import Role
from tests.engine.raft.harness import Cluster, sid


def _all_hold(c: Cluster) -> None:
    for node in c.nodes.values():
        node.raft.check_invariants()


def test_invariants_hold_through_elections_changes_reads_and_transfers() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    _all_hold(c)
    c.elect("a")
    _all_hold(c)
    for n in range(5):
        c.step("a", Propose(n, (b"x%d" % n,)))
        _all_hold(c)
    c.step("a", ReadIndex(7))
    c.step("a", AddServer(8, sid("d")))
    _all_hold(c)
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    _all_hold(c)
    c.step("a", TransferLeadership(9, sid("b")))
    c.stabilize()
    _all_hold(c)
    assert c["b"].role is Role.LEADER


@pytest.mark.parametrize(
    ("name", "breaks"),
    [
        ("commit past the log", lambda r: setattr(r, "commit", r.log.last_index() + 1)),
        ("applied past commit", lambda r: setattr(r, "applied", r.commit + 1)),
        ("uncommitted bytes", lambda r: setattr(r, "uncommitted_bytes", 1)),
        ("a follower keeps progress", lambda r: r.progress.update({sid("b"): Progress(1, 0)})),
        ("a candidate with a leader", lambda r: setattr(r, "role", Role.CANDIDATE)),
    ],
)
def test_a_broken_follower_fails_its_invariants(name: str, breaks: object) -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    follower = c["b"]
    follower.check_invariants()
    breaks(follower)  # type: ignore[operator]
    with pytest.raises(AssertionError):
        follower.check_invariants()


def test_a_broken_leader_fails_its_invariants() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    leader = c["a"]
    leader.progress[sid("z")] = Progress(1, 0)
    with pytest.raises(AssertionError, match="progress of a non-member"):
        leader.check_invariants()
    del leader.progress[sid("z")]
    leader.vote = sid("b")
    with pytest.raises(AssertionError, match="leader's vote"):
        leader.check_invariants()


def test_a_follower_times_out_at_its_next_deadline() -> None:
    c = Cluster(["a", "b", "c"])
    b = c["b"]
    due = b.next_deadline_ms()
    assert due == b.election_deadline_ms and due is not None
    c.step("b", Tick(due - 1))
    assert b.role is Role.FOLLOWER and not c.sent
    c.step("b", Tick(due))
    assert b.role is Role.PRE_CANDIDATE
    assert {type(m) for m in c.take()} == {VoteRequest}


def test_a_leader_sends_heartbeats_at_its_next_deadline() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    a = c["a"]
    c.step("a", Tick(c.now_ms + 1))
    c.take()
    due = a.next_deadline_ms()
    assert due is not None and due > a.now_ms
    c.step("a", Tick(due - 1))
    assert not c.sent
    c.step("a", Tick(due))
    assert {type(m) for m in c.take()} == {Heartbeat}


def test_a_transfer_times_out_at_the_next_deadline() -> None:
    """Ticking only at ``next_deadline_ms`` (as the runtime does) abandons a transfer
    exactly at its deadline, which lies off the heartbeat grid."""
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"b"}
    c.step("a", Propose(1, (b"x",)))
    a = c["a"]
    c.step("a", Tick(c.now_ms + 7))  # a heartbeat: the grid now runs from here
    c.step("a", Tick(a.now_ms + 3))
    c.step("a", TransferLeadership(9, sid("b")))
    deadline_ms = a.now_ms + c.limits.election_timeout_ms_min
    rejected = []
    while not rejected:
        due = a.next_deadline_ms()
        assert due is not None and due <= deadline_ms
        rejected = c.step("a", Tick(due)).rejected
        c.deliver(c.take())
    assert a.now_ms == deadline_ms
    assert [(r.request_id, r.reason) for r in rejected] == [(9, "timeout")]


def test_a_lone_leader_has_no_timer() -> None:
    c = Cluster(["a"])
    c.elect("a")
    assert c["a"].next_deadline_ms() is None
