"""Log replication and the commit rule (Raft paper sections 5.3, 5.4.2), flow control."""

from __future__ import annotations

import dataclasses

from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Propose, Receive, Tick
from engine.raft.messages import AppendRequest, AppendResponse, Heartbeat
from engine.raft.progress import ProgressState
from engine.raft.server import Fault, Role
from tests.engine.raft.harness import LIMITS, Cluster, append_request, sid


def _logs_equal(c: Cluster, names: list[str]) -> bool:
    logs = []
    for n in names:
        log = c[n].log
        logs.append([(i, log.term(i)) for i in range(1, log.last_index() + 1)])
    return all(log == logs[0] for log in logs)


def test_a_proposal_is_replicated_committed_and_applied_everywhere() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    rd = c.step("a", Propose(7, (b"x", b"y")))
    assert [(x.request_id, x.first_index, x.last_index, x.term) for x in rd.accepted] == [
        (7, 2, 3, 1)
    ]
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    for n in "abc":
        assert c[n].commit == 3 and c[n].applied == 3
        assert [e.data for e in c.nodes[n].storage.entries(2, 4, 1 << 30)] == [b"x", b"y"]


def test_a_follower_answers_an_append_only_after_persisting_it() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.nodes["b"].auto_persist = False
    c.step("a", Propose(1, (b"x",)))
    c.deliver(c.take(AppendRequest, dst="b"))
    assert c.take(AppendResponse) == []
    c.persist("b")
    responses = c.take(AppendResponse)
    assert [(m.src, m.success, m.match_index) for m in responses] == [("b", True, 2)]


def test_the_leader_counts_itself_only_after_its_own_persist() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.nodes["a"].auto_persist = False
    c.step("a", Propose(1, (b"x",)))
    c.deliver(c.take(AppendRequest, dst="b"))
    c.deliver(c.take(AppendResponse))
    assert c["a"].commit == 1, "one follower alone is no quorum while the leader has not fsynced"
    c.persist("a")
    assert c["a"].commit == 2


def test_a_follower_rejects_a_mismatched_append_with_a_conflict_hint() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    b = c["b"]
    b.step(Receive(append_request("a", "b", 1, prev_index=5, prev_term=1, commit=1)))
    rd = b.ready()
    (resp,) = rd.messages_after_persist
    assert type(resp) is AppendResponse and not resp.success
    assert (resp.rejected_prev_index, resp.conflict_term, resp.conflict_index) == (5, 0, 2)


def test_a_follower_truncates_conflicting_entries_and_keeps_matching_ones() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    b = c["b"]
    old = [Entry(2, 1, EntryKind.COMMAND, 0, b"old2"), Entry(3, 1, EntryKind.COMMAND, 0, b"old3")]
    b.step(Receive(append_request("a", "b", 1, prev_index=1, prev_term=1, entries=old, commit=1)))
    c.process("b")
    new = [Entry(3, 2, EntryKind.COMMAND, 0, b"new3")]
    b.step(Receive(append_request("c", "b", 2, prev_index=2, prev_term=1, entries=new, commit=1)))
    c.process("b")
    data = [e.data for e in c.nodes["b"].storage.entries(2, 4, 1 << 30)]
    assert data == [b"old2", b"new3"] and b.log.last_index() == 3


def test_the_leader_repairs_divergent_followers_with_fast_back_off() -> None:
    limits = dataclasses.replace(LIMITS, append_entries_per_message_max=2)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    c.cut = {"b", "c"}
    for n in range(20):
        c.step("a", Propose(n, (b"lost%d" % n,)))
    c.cut = {"a"}
    c.sent = []
    c.tick(4 * limits.election_timeout_ms_max, ["b", "c"], deliver=True)
    leader = "b" if c["b"].role is Role.LEADER else "c"
    assert c[leader].role is Role.LEADER
    for n in range(5):
        c.step(leader, Propose(100 + n, (b"kept%d" % n,)))
    c.stabilize()
    c.cut = set()
    c.tick(4 * limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].role is Role.FOLLOWER
    assert _logs_equal(c, ["a", "b", "c"]) and c["a"].log.last_index() == 7


def test_only_entries_of_the_current_term_are_committed_by_counting_figure_8() -> None:
    for fault, committed in ((Fault.NONE, False), (Fault.COMMIT_ANY_TERM, True)):
        limits = dataclasses.replace(LIMITS, append_entries_per_message_max=1)
        c = Cluster(["a", "b", "c"], limits=limits, fault=fault)
        c.elect("a")
        c.cut = {"b", "c"}
        c.step("a", Propose(1, (b"term1",)))  # index 2 (term 1), only on a
        c.sent = []
        # b wins term 2 with c's vote; its no-op at index 2 reaches no one.
        c.cut = {"a"}
        c.tick(limits.election_timeout_ms_min, ["c"])
        c.sent = []
        c.campaign("b")
        assert c["b"].role is Role.LEADER and c["b"].term == 2
        c.sent = []
        # a loses its lease, then wins term 3 with c's vote (its log is longer).
        c.cut = {"b"}
        c.tick(2 * limits.election_timeout_ms_min + limits.tick_ms, ["a"])
        c.sent = []
        for _ in range(3):
            c.campaign("a")
            if c["a"].role is Role.LEADER:
                break
        a = c["a"]
        assert a.role is Role.LEADER and a.term == 3
        # c rejects the no-op at index 3, then takes the term-1 entry at index 2 alone.
        for _ in range(2):
            c.deliver(c.take(AppendRequest, dst="c")[:1])
            c.deliver(c.take(AppendResponse))
        assert c["c"].log.term(2) == 1 and c["c"].log.last_index() == 2
        assert (a.commit >= 2) is committed, fault


def test_flow_control_bounds_messages_in_flight_per_follower() -> None:
    limits = dataclasses.replace(
        LIMITS, append_entries_per_message_max=1, inflight_messages_per_follower_max=3
    )
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    c.tick(limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].progress[sid("b")].state is ProgressState.REPLICATE
    for n in range(10):
        c.step("a", Propose(n, (b"x",)))
    appends = c.take(AppendRequest, dst="b")
    assert len(appends) == 3
    c.deliver(appends[:1])
    c.deliver(c.take(AppendResponse))
    assert len(c.take(AppendRequest, dst="b")) == 1


def test_the_leader_stamps_its_clock_in_entries_and_it_never_decreases() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(100, deliver=True)
    c.step("a", Propose(1, (b"x",)))
    c.step("a", Tick(5))  # a clock going backwards is ignored
    c.step("a", Propose(2, (b"y",)))
    stamps = [e.now_ms for e in c.nodes["a"].storage.entries(1, 4, 1 << 30)]
    assert stamps == sorted(stamps) and stamps[1] == stamps[2] == c.now_ms


def test_timers_run_on_the_monotonic_clock_and_stamps_never_go_back() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.step("a", Tick(c.now_ms + 1, wall_ms=5_000_000))
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    # The wall clock of a steps back an hour: its timers and its stamps carry on.
    c.step("a", Tick(c.now_ms + 2, wall_ms=5_000_000 - 3_600_000))
    c.step("a", Propose(2, (b"y",)))
    c.stabilize()
    assert c["a"].now_ms == c.now_ms + 2
    # a goes; b takes over with its wall clock (the harness's, ticks only) far behind:
    # its entries are stamped no lower than those it received.
    c.cut = {"a"}
    c.tick(LIMITS.election_timeout_ms_max, names=["b", "c"])
    c.sent = []
    c.elect("b")
    assert c["b"].wall_ms < 5_000_000
    c.step("b", Propose(3, (b"z",)))
    c.stabilize()
    stamps = [e.now_ms for e in c.nodes["b"].storage.entries(1, 6, 1 << 30)]
    assert len(stamps) == 5 and stamps == sorted(stamps), stamps
    assert stamps[1:] == [5_000_000] * 4


def test_proposals_are_rejected_on_a_follower_and_under_backpressure() -> None:
    limits = dataclasses.replace(LIMITS, uncommitted_bytes_max=10)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    rd = c.step("b", Propose(1, (b"x",)))
    assert [(r.request_id, r.reason, r.leader) for r in rd.rejected] == [(1, "not_leader", "a")]
    c.cut = {"b", "c"}
    assert c.step("a", Propose(2, (b"123456",))).accepted
    rd = c.step("a", Propose(3, (b"123456",)))
    assert [r.reason for r in rd.rejected] == ["backpressure"]


def test_a_restarted_server_recovers_term_vote_and_log_and_reapplies() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.restart("b")
    b = c["b"]
    assert (b.term, b.log.last_index()) == (1, 2)
    assert b.commit == 2 and b.applied == 2


def _appends_to_b_while_ticking(c: Cluster, ms: int) -> list[tuple[int, int]]:
    """Tick ``ms``, delivering everything after each tick; (time, first index) of each
    append with entries the leader sent ``b`` meanwhile."""
    seen: list[tuple[int, int]] = []
    start = c.now_ms
    while c.now_ms < start + ms:
        c.tick(c.limits.tick_ms)
        for m in c.sent:
            if isinstance(m, AppendRequest) and m.dst == sid("b") and m.entries:
                seen.append((c.now_ms - start, m.entries[0].index))
        c.stabilize()
    return seen


def test_a_follower_slow_to_persist_is_not_sent_again_what_it_received() -> None:
    # Its heartbeat answers name the last entry it holds, durable or not: the pipeline
    # is alive, and resending what is in flight would only double the bytes sent.
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].progress[sid("b")].state is ProgressState.REPLICATE
    c.nodes["b"].auto_persist = False
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    assert c["a"].commit == 2 and c["a"].progress[sid("b")].match == 1
    unacked_ms = c.limits.append_unacked_ms_max
    assert _appends_to_b_while_ticking(c, unacked_ms - c.limits.heartbeat_interval_ms) == []
    assert c["a"].progress[sid("b")].received == 2
    # Held but never acknowledged for append_unacked_ms_max: perhaps never to be durable
    # (a failed disk); sent again.
    resent = _appends_to_b_while_ticking(c, c.limits.append_stall_ms + unacked_ms)
    assert [index for _ms, index in resent][:1] == [2]
    c.persist("b")
    c.stabilize()
    assert c["a"].progress[sid("b")].match == 2


def test_a_lost_append_is_sent_again_after_the_stall_time() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.step("a", Propose(1, (b"x",)))
    lost = c.take(AppendRequest, dst="b")
    assert [m.entries[0].index for m in lost] == [2]
    c.stabilize()
    resent = _appends_to_b_while_ticking(c, c.limits.append_stall_ms * 2)
    stall_ms, heartbeat_ms = c.limits.append_stall_ms, c.limits.heartbeat_interval_ms
    assert len(resent) == 1 and resent[0][1] == 2
    # Counted from the pipeline's last move (the answer to the append before it), found
    # at a heartbeat tick.
    assert stall_ms - heartbeat_ms <= resent[0][0] <= stall_ms + heartbeat_ms
    assert c["b"].log.last_index() == 2 and c["a"].progress[sid("b")].match == 2


def test_appends_taken_in_one_ready_are_answered_once() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.nodes["b"].auto_persist = False
    for n in range(3):
        c.step("a", Propose(n, (b"x%d" % n,)))
    appends = c.take(AppendRequest, dst="b")
    assert [m.entries[0].index for m in appends] == [2, 3, 4]
    b = c.nodes["b"].raft
    for m in appends:
        b.step(Receive(m))  # all three before b's next Ready
    c.process("b")
    c.persist("b")
    responses = c.take(AppendResponse, dst="a")
    assert [(m.success, m.match_index) for m in responses] == [(True, 4)]
    c.deliver(responses)
    pr = c["a"].progress[sid("b")]
    assert pr.match == 4 and not pr.inflight and pr.inflight_bytes == 0


def test_proposals_stepped_before_one_ready_go_to_each_follower_as_one_append() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    a = c.nodes["a"].raft
    for n in range(3):
        a.step(Propose(n, (b"x%d" % n,)))  # one turn of the host's loop
    c.process("a")
    for follower in ("b", "c"):
        appends = c.take(AppendRequest, dst=follower)
        assert [[e.index for e in m.entries] for m in appends] == [[2, 3, 4]]
        c.deliver(appends)
    c.stabilize()
    assert a.commit == 4 and _logs_equal(c, ["a", "b", "c"])


def test_a_follower_sent_appends_steadily_gets_no_periodic_heartbeat() -> None:
    # An append in flight within the interval, and a match that moves: the heartbeat
    # and its answer would tell neither side anything the appends do not.
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.sent = []
    rounds = c.limits.heartbeat_interval_ms // c.limits.tick_ms
    heartbeats = []
    for n in range(11 * rounds):
        c.step("a", Propose(n, (b"x",)))
        c.tick(c.limits.tick_ms)  # with the append to b still unanswered
        heartbeats.append(len(c.take(Heartbeat, dst="b")))
        c.stabilize()
    # The first interval's: b's match had not moved since the election.
    assert sum(heartbeats[:rounds]) == 1 and sum(heartbeats[rounds:]) == 0
    assert c["b"].role is Role.FOLLOWER and c["b"].term == c["a"].term == 1
    assert c["b"].log.last_index() == c["a"].log.last_index()
    # Once its appends are all answered, the heartbeats come back, with the commit.
    c.tick(c.limits.heartbeat_interval_ms)
    assert [m.commit for m in c.take(Heartbeat, dst="b")] == [c["a"].commit]


def test_a_read_round_and_a_stalled_pipeline_still_get_heartbeats() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    c.step("a", Propose(1, (b"x",)))
    c.take(AppendRequest, dst="b")  # lost: b's match stops moving
    c.stabilize()
    sent = []
    for _ in range(2 * c.limits.heartbeat_interval_ms // c.limits.tick_ms):
        c.tick(c.limits.tick_ms)
        sent += c.take(Heartbeat, dst="b")
        c.stabilize()
    assert sent, "an append in flight whose answer does not come is no reason to be silent"
