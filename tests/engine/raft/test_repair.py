"""Repair mode: a server whose storage lost durable entries (or its hard state) takes no
part in elections until a leader has given it back everything committed, then records a
vote for that leader before it acts as a voter again."""

from __future__ import annotations

from engine.raft.entry import Entry, EntryKind
from engine.raft.events import HardState, Propose, Receive, Tick
from engine.raft.messages import (
    AppendResponse,
    Heartbeat,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.raft.server import Role
from tests.engine.raft.harness import Cluster, append_request, sid, vote_request


def _lose_entries_after(c: Cluster, name: str, index: int) -> None:
    """The durable log of ``name`` keeps entries up to ``index`` only (the media lost
    the rest); the hard state survives."""
    durable = c.nodes[name].storage.durable_state
    del durable.entries[index - durable.snap_index :]


def _commit_x_on_a_and_b_only() -> Cluster:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"c"}
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    assert c["a"].commit == 2 and c["b"].log.last_index() == 2
    assert c["c"].log.last_index() == 1
    c.sent = []
    return c


def test_without_repair_a_lost_committed_entry_lets_a_leader_without_it_win() -> None:
    """The hazard repair mode exists for: b acknowledged index 2 (which made it
    committed), lost it, and then votes for c, which never had it."""
    c = _commit_x_on_a_and_b_only()
    _lose_entries_after(c, "b", 1)
    c.restart("b")
    c.cut = {"a"}
    c.campaign("c")
    assert c["c"].role is Role.LEADER
    assert c["c"].log.last_index() < 2 or c["c"].log.term(2) != 1, "committed entry lacking"


def test_a_repairing_server_refuses_the_vote_that_would_lose_a_committed_entry() -> None:
    c = _commit_x_on_a_and_b_only()
    _lose_entries_after(c, "b", 1)
    c.restart("b", repair=True)
    b = c["b"]
    assert b.repairing and b.term == 2, "one term above the recovered one"
    assert b.commit == 0, "nothing after the checkpoint counts as committed"
    c.cut = {"a"}
    for _ in range(3):
        c.campaign("c")
        assert c["c"].role is not Role.LEADER
    assert b.vote is None and b.repairing


def test_a_repairing_server_is_repaired_by_a_leader_then_votes_for_it() -> None:
    c = _commit_x_on_a_and_b_only()
    _lose_entries_after(c, "b", 1)
    c.restart("b", repair=True)
    c.cut = set()
    # a (term 1) hears b's higher term on the first exchange and steps down; a and c
    # elect a leader in a higher term, which brings b back.
    c.tick(c.limits.heartbeat_interval_ms, ["a"], deliver=True)
    assert c["a"].role is Role.FOLLOWER and c["a"].term == 2
    for _ in range(40):
        c.tick(c.limits.election_timeout_ms_max, ["a", "c"], deliver=True)
        if not c["b"].repairing:
            break
    b = c["b"]
    leader = c[str(b.leader)]
    assert not b.repairing and leader.role is Role.LEADER and leader.term == b.term
    assert b.vote == leader.id and b.term >= 3
    assert [rd.repaired for rd in c.nodes["b"].readies].count(True) == 1
    repaired = next(rd for rd in c.nodes["b"].readies if rd.repaired)
    assert repaired.hard_state is not None and repaired.hard_state.vote == leader.id
    assert b.log.term(2) == 1 and [e.data for e in b.log.entries(2, 3, 1 << 20, 10)] == [b"x"]
    assert b.applied == leader.commit


def test_repair_ends_only_with_a_durable_committed_entry_of_the_leaders_term() -> None:
    c = _commit_x_on_a_and_b_only()
    _lose_entries_after(c, "b", 1)
    c.restart("b", repair=True)
    c.nodes["b"].auto_persist = False
    b = c["b"]
    x = c["a"].log.entries(2, 3, 1 << 20, 10)
    noop = Entry(3, 2, EntryKind.NOOP, 0, b"")
    # The committed entry 2 is of an older term: not enough.
    c.step(
        "b", Receive(append_request("a", "b", 2, prev_index=1, prev_term=1, entries=x, commit=2))
    )
    c.persist("b")
    assert b.commit == 2 and b.repairing
    c.step(
        "b",
        Receive(append_request("a", "b", 2, prev_index=2, prev_term=1, entries=[noop], commit=3)),
    )
    assert b.commit == 3 and b.repairing, "held in memory, not yet durable"
    rd = c.persist("b")
    assert not b.repairing and rd.repaired and rd.hard_state == HardState(2, sid("a"), 3)


def test_a_heartbeats_commit_is_not_trusted_while_repairing() -> None:
    c = Cluster(["a", "b", "c"])
    c.restart("b", repair=True)
    b = c["b"]
    b.step(Receive(Heartbeat(src=sid("a"), dst=sid("b"), term=1, commit=5, read_seq=0)))
    assert b.commit == 0 and b.leader == "a" and b.repairing


def test_a_repairing_server_never_campaigns_nor_grants_a_vote_or_pre_vote() -> None:
    c = Cluster(["a", "b", "c"])
    c.restart("b", repair=True)
    b = c["b"]
    c.tick(5 * c.limits.election_timeout_ms_max, ["b"])
    assert b.role is Role.FOLLOWER and not c.take(VoteRequest)
    c.step("b", Receive(TimeoutNow(src=sid("a"), dst=sid("b"), term=1)))
    assert b.role is Role.FOLLOWER and not c.take(VoteRequest)
    for pre in (True, False):
        c.step("b", Receive(vote_request("a", "b", 9, last_index=50, last_term=9, pre=pre)))
    c.tick(c.limits.tick_ms, ["b"])
    grants = [m.granted for m in c.take(VoteResponse)]
    assert grants == [False, False] and b.vote is None and b.term == 9


def test_a_vote_forgotten_with_the_hard_state_is_not_given_twice() -> None:
    """b voted for c in term 1; its hard state is lost. Without repair it votes for a in
    the same term (two leaders could win term 1); in repair it refuses, and once c leads
    it records its vote for c in term 1 again."""
    for repair in (False, True):
        c = Cluster(["a", "b", "c"], pre_vote=False)
        c.step("b", Receive(vote_request("c", "b", 1)))
        assert c["b"].vote == "c"
        c.take()
        c.nodes["b"].storage.durable_state.hard_state = None
        c.restart("b", repair=repair)
        c.step("b", Receive(vote_request("a", "b", 1)))
        granted = [m.granted for m in c.take(VoteResponse)]
        assert granted == [not repair]
    b = c["b"]
    # c wins term 1 with b's vote from before the damage, and repairs b.
    c["c"].election_deadline_ms = 0
    c.now_ms += 1
    c.step("c", Tick(c.now_ms))
    c.take(VoteRequest)
    c.step("c", Receive(VoteResponse(src=sid("b"), dst=sid("c"), term=1, granted=True, pre=False)))
    assert c["c"].role is Role.LEADER and c["c"].term == 1
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, ["c"], deliver=True)
    assert not b.repairing and (b.term, b.vote) == (1, "c")
    assert c.nodes["b"].storage.durable_state.hard_state == HardState(1, sid("c"), 1)


def test_a_leader_that_counted_acknowledgements_from_before_the_damage_steps_down() -> None:
    c = _commit_x_on_a_and_b_only()
    _lose_entries_after(c, "b", 1)
    c.restart("b", repair=True)
    c.step("b", Receive(append_request("a", "b", 1, prev_index=2, prev_term=1, commit=2)))
    answers = c.take(AppendResponse)
    assert [(m.term, m.success) for m in answers] == [(2, False)]
    c.deliver(answers)
    assert c["a"].role is Role.FOLLOWER and c["a"].term == 2
