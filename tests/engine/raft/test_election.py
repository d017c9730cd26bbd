"""Leader election (Raft paper section 5.2, 5.4.1) with pre-vote and check-quorum."""

from __future__ import annotations

from engine.raft.events import HardState, Receive, Tick
from engine.raft.messages import Heartbeat, VoteRequest, VoteResponse
from engine.raft.server import Role
from tests.engine.raft.harness import Cluster, append_response, sid, vote_request


def test_follower_times_out_and_pre_votes_without_changing_its_term() -> None:
    c = Cluster(["a", "b", "c"])
    c.tick(c.limits.election_timeout_ms_max, ["a"])
    a = c["a"]
    assert a.role is Role.PRE_CANDIDATE and a.term == 0 and a.vote is None
    requests = c.take(VoteRequest)
    assert sorted(m.dst for m in requests) == ["b", "c"]
    assert all(m.pre and m.term == 1 and m.last_index == 0 for m in requests)


def test_pre_vote_majority_starts_a_real_election_that_persists_term_and_vote() -> None:
    c = Cluster(["a", "b", "c"])
    c.tick(c.limits.election_timeout_ms_max, ["a"])
    c.deliver(c.take(VoteRequest))
    assert c["b"].term == 0, "a pre-vote changes no term"
    c.deliver(c.take(VoteResponse))
    a = c["a"]
    assert a.role is Role.CANDIDATE and a.term == 1 and a.vote == "a"
    hs = [rd.hard_state for rd in c.nodes["a"].readies if rd.hard_state]
    assert hs[-1] == HardState(1, sid("a"), 0)
    reqs = [rd for rd in c.nodes["a"].readies if rd.messages_after_persist]
    assert any(type(m) is VoteRequest and not m.pre for m in reqs[-1].messages_after_persist)


def test_candidate_with_majority_becomes_leader_and_appends_a_noop() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    a = c["a"]
    assert a.role is Role.LEADER and a.term == 1
    assert c["b"].leader == "a" and c["c"].leader == "a"
    assert a.commit == 1 and c["b"].log.last_index() == 1


def test_vote_is_granted_at_most_once_per_term() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False)
    b = c["b"]
    b.step(Receive(vote_request("a", "b", 1)))
    b.step(Receive(vote_request("c", "b", 1)))
    rd = b.ready()
    grants = [(m.dst, m.granted) for m in rd.messages_after_persist if type(m) is VoteResponse]
    assert grants == [("a", True), ("c", False)]
    assert rd.hard_state == HardState(1, sid("a"), 0)


def test_vote_is_refused_to_a_candidate_whose_log_is_less_up_to_date() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    b = c["b"]
    stale = vote_request("c", "b", 5)
    c.now_ms += 10 * c.limits.election_timeout_ms_max
    b.step(Tick(c.now_ms))
    b.step(Receive(stale))
    rd = b.ready()
    votes = [m for m in rd.messages_after_persist if type(m) is VoteResponse]
    assert [v.granted for v in votes] == [False]


def test_a_higher_term_makes_a_leader_step_down() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    a = c["a"]
    a.step(Receive(append_response("b", "a", 7, success=False)))
    assert a.role is Role.FOLLOWER and a.term == 7 and a.vote is None


def test_a_message_of_a_stale_term_is_answered_with_the_current_term() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    b = c["b"]
    b.step(Receive(Heartbeat(src=sid("c"), dst=sid("b"), term=0, commit=0, read_seq=0)))
    rd = b.ready()
    assert [(type(m).__name__, m.term) for m in rd.messages_after_persist] == [
        ("AppendResponse", 1)
    ]
    assert b.leader == "a"


def test_pre_vote_keeps_a_partitioned_server_from_raising_terms() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"c"}
    c.tick(5 * c.limits.election_timeout_ms_max, deliver=True)
    assert c["c"].term == 1 and c["c"].role is Role.PRE_CANDIDATE
    c.cut = set()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].role is Role.LEADER and c["a"].term == 1 and c["c"].leader == "a"


def test_check_quorum_makes_a_leader_without_a_majority_step_down() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.cut = {"b", "c"}
    c.tick(2 * c.limits.election_timeout_ms_min + c.limits.tick_ms, ["a"], deliver=True)
    assert c["a"].role is Role.FOLLOWER


def test_a_voter_that_hears_from_its_leader_ignores_a_campaign() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    b = c["b"]
    b.step(Receive(vote_request("c", "b", 2, last_index=9, last_term=1)))
    rd = b.ready()
    assert b.term == 1 and not rd.messages_after_persist
    transfer = vote_request("c", "b", 2, last_index=9, last_term=1, transfer=True)
    b.step(Receive(transfer))
    rd = b.ready()
    assert b.term == 2 and [m.granted for m in rd.messages_after_persist] == [True]


def test_single_server_elects_itself_and_commits_after_its_own_persist() -> None:
    c = Cluster(["a"])
    c.nodes["a"].auto_persist = False
    c.tick(c.limits.election_timeout_ms_max)
    a = c["a"]
    assert a.role is Role.LEADER and a.commit == 0
    c.persist("a")
    assert a.commit == 1
