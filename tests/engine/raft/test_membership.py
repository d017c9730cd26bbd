"""Single-server membership changes (thesis chapter 4) and leadership transfer (3.10)."""

from __future__ import annotations

import dataclasses

from engine.raft.config import Configuration
from engine.raft.events import (
    AddServer,
    DemoteServer,
    Propose,
    RemoveServer,
    TransferLeadership,
)
from engine.raft.messages import TimeoutNow
from engine.raft.server import Role
from engine.sim.storage import MemStorage
from tests.engine.raft.harness import LIMITS, Cluster, sid


def _ids(*names: str) -> tuple:
    return tuple(sid(n) for n in names)


def test_a_new_server_joins_as_learner_and_is_promoted_once_caught_up() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.elect("a")
    for n in range(5):
        c.step("a", Propose(n, (b"x%d" % n,)))
    c.stabilize()
    assert c["d"].log.last_index() == 0, "d is no member yet"
    rd = c.step("a", AddServer(42, sid("d")))
    assert c["a"].config == Configuration(_ids("a", "b", "c"), _ids("d"))
    assert not rd.rejected
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].config == Configuration(_ids("a", "b", "c", "d"))
    done = [x for n in "a" for rd in c.nodes[n].readies for x in rd.completed]
    assert [d.request_id for d in done] == [42]
    assert c["d"].config.voters == _ids("a", "b", "c", "d")
    assert c["d"].log.last_index() == c["a"].log.last_index()


def test_a_server_added_as_learner_only_replicates_and_never_votes() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.elect("a")
    for n in range(3):
        c.step("a", Propose(n, (b"x%d" % n,)))
    rd = c.step("a", AddServer(7, sid("d"), learner_only=True))
    assert not rd.rejected
    c.stabilize()
    c.tick(3 * c.limits.heartbeat_interval_ms, deliver=True)
    learner_config = Configuration(_ids("a", "b", "c"), _ids("d"))
    assert c["a"].config == learner_config == c["d"].config, "it stays a learner"
    done = [x for rd in c.nodes["a"].readies for x in rd.completed]
    assert [d.request_id for d in done] == [7], "complete once the entry committed"
    assert c["d"].log.last_index() == c["a"].log.last_index()
    assert c["d"].commit == c["a"].commit
    rd = c.step("a", AddServer(8, sid("d"), learner_only=True))
    assert [(r.request_id, r.reason) for r in rd.rejected] == [(8, "bad_request")]


def test_a_learner_is_promoted_later_once_caught_up() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.elect("a")
    c.step("a", AddServer(1, sid("d"), learner_only=True))
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    for n in range(3):
        c.step("a", Propose(10 + n, (b"y%d" % n,)))
    rd = c.step("a", AddServer(2, sid("d")))
    assert not rd.rejected
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].config == Configuration(_ids("a", "b", "c", "d"))
    assert c["d"].config.voters == _ids("a", "b", "c", "d")
    done = [x.request_id for rd in c.nodes["a"].readies for x in rd.completed]
    assert done == [1, 2]
    rd = c.step("a", AddServer(3, sid("d")))
    assert [(r.request_id, r.reason) for r in rd.rejected] == [(3, "bad_request")]


def test_one_change_at_a_time() -> None:
    c = Cluster(["a", "b", "c", "d", "e"], voters=["a", "b", "c"])
    c.elect("a")
    c.step("a", AddServer(1, sid("d")))
    rd = c.step("a", AddServer(2, sid("e")))
    assert [(r.request_id, r.reason) for r in rd.rejected] == [(2, "change_pending")]


def test_a_learner_never_campaigns() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.tick(3 * c.limits.election_timeout_ms_max, ["d"])
    assert c["d"].role is Role.FOLLOWER and c["d"].term == 0


def test_a_removed_follower_is_no_longer_counted() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.step("a", RemoveServer(5, sid("c")))
    c.stabilize()
    assert c["a"].config == Configuration(_ids("a", "b"))
    c.cut = {"c"}
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    assert c["a"].commit == c["a"].log.last_index()


def test_a_demoted_voter_replicates_on_as_a_learner_and_counts_for_no_quorum() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    rd = c.step("a", DemoteServer(5, sid("c")))
    assert not rd.rejected
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    demoted = Configuration(_ids("a", "b"), _ids("c"))
    assert c["a"].config == demoted == c["c"].config
    done = [x.request_id for rd in c.nodes["a"].readies for x in rd.completed]
    assert done == [5]
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    assert c["c"].log.last_index() == c["a"].log.last_index(), "it still replicates"
    c.cut = {"b"}
    c.step("a", Propose(2, (b"y",)))
    c.stabilize()
    assert c["a"].commit < c["a"].log.last_index(), "a learner's copy makes no quorum"
    c.cut = {"a", "b"}
    c.tick(3 * c.limits.election_timeout_ms_max, ["c"])
    assert c["c"].role is Role.FOLLOWER, "a learner never campaigns"


def test_only_a_voter_other_than_the_leader_is_demoted_one_change_at_a_time() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.elect("a")
    for request_id, who in ((1, "a"), (2, "d")):
        rd = c.step("a", DemoteServer(request_id, sid(who)))
        assert [(r.request_id, r.reason) for r in rd.rejected] == [(request_id, "bad_request")]
    c.step("a", DemoteServer(3, sid("b")))
    rd = c.step("a", DemoteServer(4, sid("c")))
    assert [(r.request_id, r.reason) for r in rd.rejected] == [(4, "change_pending")]
    rd = c.step("b", DemoteServer(5, sid("c")))
    assert [r.request_id for r in rd.rejected] == [5], "only a leader changes members"


def test_a_leader_that_removes_itself_steps_down_once_the_change_commits() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.step("a", RemoveServer(5, sid("a")))
    assert c["a"].role is Role.LEADER
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    assert c["a"].role is Role.FOLLOWER
    c.tick(3 * c.limits.election_timeout_ms_max, deliver=True)
    assert c["a"].role is Role.FOLLOWER
    leaders = [n for n in "bc" if c[n].role is Role.LEADER]
    assert len(leaders) == 1


def test_leadership_transfer_hands_over_to_an_up_to_date_target() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.step("a", Propose(1, (b"x",)))
    c.stabilize()
    rd = c.step("a", TransferLeadership(9, sid("b")))
    assert [type(m) for m in rd.messages] == [TimeoutNow]
    assert [r.reason for r in c.step("a", Propose(2, (b"y",))).rejected] == ["transferring"]
    c.stabilize()
    assert c["b"].role is Role.LEADER and c["a"].role is Role.FOLLOWER and c["b"].term == 2


def test_a_transfer_that_does_not_finish_in_time_is_abandoned() -> None:
    limits = dataclasses.replace(LIMITS)
    c = Cluster(["a", "b", "c"], limits=limits)
    c.elect("a")
    c.cut = {"b"}
    c.step("a", TransferLeadership(9, sid("b")))
    c.tick(limits.election_timeout_ms_min + limits.tick_ms, ["a", "c"], deliver=True)
    rejected = [r for rd in c.nodes["a"].readies for r in rd.rejected]
    assert [(r.request_id, r.reason) for r in rejected] == [(9, "timeout")]
    assert c["a"].role is Role.LEADER
    assert c.step("a", Propose(1, (b"x",))).accepted


def test_storage_keeps_a_membership_change_across_restart() -> None:
    c = Cluster(["a", "b", "c", "d"], voters=["a", "b", "c"])
    c.elect("a")
    c.step("a", AddServer(1, sid("d")))
    c.stabilize()
    c.tick(c.limits.heartbeat_interval_ms, deliver=True)
    storage = c.nodes["b"].storage
    assert isinstance(storage, MemStorage)
    c.restart("b")
    assert c["b"].config == Configuration(_ids("a", "b", "c", "d"))
