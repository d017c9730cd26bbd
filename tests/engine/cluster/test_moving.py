"""Moving replicas off draining and lost nodes: each step as the module's rule says, and a
drain or a forget run step by step (with changes interrupted half-way) to its end: the
queue keeps its replica count on active nodes, its leader off a draining node, and never
loses its last member."""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cluster.moving import (
    AddReplica,
    GroupView,
    RemoveReplica,
    Step,
    TransferLeader,
    holding,
    next_step,
    state_of,
)
from engine.cluster.records import NodeState, QueueRecord
from tests.engine.cluster.test_placement import _nodes, _queue


def _view(here: str, voters: tuple[str, ...], learners: tuple[str, ...] = ()) -> GroupView:
    return GroupView(here, tuple(sorted(voters)), learners, busy=False)


def test_a_leader_on_a_draining_node_hands_its_leadership_to_an_active_voter() -> None:
    nodes = _nodes(["draining", "active", "active"])
    q = _queue("q", ("n0", "n1"), "n0")
    assert next_step(nodes, [q], q, _view("n0", ("n0", "n1"))) == TransferLeader("n1")


def test_a_replica_on_a_draining_node_gets_a_new_home_then_is_removed() -> None:
    nodes = _nodes(["draining", "active", "active"])
    q = _queue("q", ("n0", "n1"), "n1")
    assert next_step(nodes, [q], q, _view("n1", ("n0", "n1"))) == AddReplica("n2")
    moved = dataclasses.replace(q, members=("n0", "n1", "n2"), generation=2)
    step = next_step(nodes, [moved], moved, _view("n1", ("n0", "n1", "n2")))
    assert step == RemoveReplica("n0", "its node is draining")


def test_nodes_out_of_reach_take_no_replica_and_no_leadership() -> None:
    nodes = _nodes(["draining", "active", "active", "active"])
    q = _queue("q", ("n0", "n1", "n2"), "n0")
    down = GroupView("n0", ("n0", "n1", "n2"), (), busy=False, down=("n1", "n3"))
    assert next_step(nodes, [q], q, down) == TransferLeader("n2")
    led = dataclasses.replace(down, here="n2")
    assert next_step(nodes, [q], q, led) is None  # n3 would take it, but is down
    placed = dataclasses.replace(q, members=("n0", "n1", "n2", "n3"))
    step = next_step(nodes, [placed], placed, led)
    assert step == RemoveReplica("n3", "placed, never added, and its node is leaving or down")


def test_a_draining_replica_that_no_node_can_take_stays() -> None:
    nodes = _nodes(["draining", "active", "active"])
    q = _queue("q", ("n0", "n1", "n2"), "n1")
    assert next_step(nodes, [q], q, _view("n1", ("n0", "n1", "n2"))) is None


def test_a_lost_replica_that_no_node_can_take_is_removed_all_the_same() -> None:
    nodes = _nodes(["lost", "active", "active"])
    q = _queue("q", ("n0", "n1", "n2"), "n1")
    step = next_step(nodes, [q], q, _view("n1", ("n0", "n1", "n2")))
    assert step == RemoveReplica("n0", "its node is lost")


def test_leftovers_of_an_interrupted_change_come_first() -> None:
    nodes = _nodes(["active", "active", "active"])
    q = _queue("q", ("n0", "n1"), "n0")
    learner = next_step(nodes, [q], q, _view("n0", ("n0", "n1"), ("n2",)))
    assert learner == RemoveReplica("n2", "a learner whose addition was interrupted")
    placed = dataclasses.replace(q, members=("n0", "n1", "n2"))
    assert next_step(nodes, [placed], placed, _view("n0", ("n0", "n1"))) == AddReplica("n2")
    busy = GroupView("n0", ("n0", "n1"), ("n2",), busy=True)
    assert next_step(nodes, [q], q, busy) is None


def test_queues_being_deleted_and_queues_on_active_nodes_do_not_move() -> None:
    nodes = _nodes(["draining", "active", "active"])
    deleting = _queue("d", ("n0", "n1"), "n1", state="deleting")
    assert next_step(nodes, [deleting], deleting, _view("n1", ("n0", "n1"))) is None
    calm = _queue("c", ("n1", "n2"), "n1")
    assert next_step(nodes, [calm], calm, _view("n1", ("n1", "n2"))) is None
    assert holding([deleting, calm], "n0") == []
    assert holding([deleting, calm], "n1") == ["c"]


@dataclasses.dataclass
class Group:
    """The queue's record and its group, as the runtime changes them step by step."""

    rec: QueueRecord
    voters: set[str]
    learners: set[str]
    leader: str
    crashes: int = 2
    """Additions that may still stop half-way."""

    def step(self, step: Step, rng: random.Random) -> None:
        """Apply ``step``; an addition may stop half-way (a crash), as the runtime's can."""
        rec = self.rec
        if isinstance(step, TransferLeader):
            assert step.target in self.voters and step.target != self.leader
            self.leader = step.target
        elif isinstance(step, AddReplica):
            members = tuple(sorted({*rec.members, step.target}))
            self.rec = dataclasses.replace(rec, members=members, generation=rec.generation + 1)
            stop = rng.choice(["placed", "learner", "done"]) if self.crashes else "done"
            self.crashes -= stop != "done"
            if stop == "learner":
                self.learners.add(step.target)
            elif stop == "done":
                self.voters.add(step.target)
        else:
            assert step.source != self.leader, "a leader never removes itself"
            self.voters.discard(step.source)
            self.learners.discard(step.source)
            members = tuple(m for m in rec.members if m != step.source)
            assert members, "the last member is never removed"
            self.rec = dataclasses.replace(rec, members=members, generation=rec.generation + 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["active", "active", "draining", "lost"]), min_size=2, max_size=6),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)
def test_a_drain_or_a_forget_runs_to_its_end(
    states: list[NodeState], replicas: int, rng: random.Random
) -> None:
    nodes = _nodes(states)
    names = sorted(nodes)
    members = tuple(sorted(rng.sample(names, min(replicas, len(names)))))
    alive = [m for m in members if state_of(nodes, m) != "lost"]
    if not alive:
        return  # no member to lead: nothing can move
    q = dataclasses.replace(_queue("q", members, members[0]), replicas=len(members))
    g = Group(q, set(members), set(), rng.choice(alive))
    for _ in range(40):
        view = GroupView(g.leader, tuple(sorted(g.voters)), tuple(sorted(g.learners)), False)
        step = next_step(nodes, [g.rec], g.rec, view)
        if step is None:
            break
        g.step(step, rng)
    else:
        raise AssertionError(f"no end: {g}")
    active = [n for n in names if nodes[n].state == "active"]
    on_active = [m for m in g.rec.members if nodes[m].state == "active"]
    assert set(g.rec.members) == g.voters and not g.learners, g
    if len(active) >= q.replicas:
        assert len(on_active) == q.replicas and len(g.rec.members) == q.replicas, g
    assert not [m for m in g.rec.members if nodes[m].state == "lost"] or not on_active, g
    if on_active and nodes[g.leader].state != "active":
        assert g.leader not in g.voters or all(
            nodes[v].state != "active" for v in g.voters if v != g.leader
        ), g
