"""Placement: on active nodes only, never two replicas on one node, least-loaded first,
balanced within one replica when queues are placed one after another, leaders spread,
and the same answer whatever order the records come in."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from engine.cluster.placement import (
    Move,
    drain_plan,
    loads,
    place,
    replacements,
)
from engine.cluster.records import NodeRecord, NodeState, QueueRecord
from engine.queue import QueuePolicy

STATES: list[NodeState] = ["active", "active", "active", "draining", "lost", "forgotten"]


def _nodes(states: list[NodeState]) -> dict[str, NodeRecord]:
    return {f"n{k}": NodeRecord(f"n{k}", f"h:{k}", s, 1, 1) for k, s in enumerate(states)}


def _queue(name: str, members: tuple[str, ...], leader: str, state: str = "live") -> QueueRecord:
    return QueueRecord(
        name=name,
        uid=f"uid-{name}",
        replicas=len(members),
        policy=QueuePolicy(),
        state=state,  # type: ignore[arg-type]
        members=tuple(sorted(members)),
        leader=leader,
        generation=1,
        bootstrap=tuple(sorted(members)),
        founders=tuple(sorted(members)),
        created=(),
        dropped=() if state != "tombstone" else tuple(sorted(members)),
        created_at_ms=0,
        created_index=1,
        live_index=1 if state != "creating" else 0,
        deleting_index=1 if state in ("deleting", "tombstone") else 0,
        tombstone_index=1 if state == "tombstone" else 0,
    )


node_states = st.lists(st.sampled_from(STATES), min_size=1, max_size=7)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, NodeRecord], list[QueueRecord]]:
    """Nodes in any states and queues on any of them (placement must cope with the
    records as they are, e.g. replicas left on a node since drained)."""
    nodes = _nodes(draw(node_states))
    names = sorted(nodes)
    queues = []
    for k in range(draw(st.integers(0, 12))):
        members = tuple(draw(st.sets(st.sampled_from(names), min_size=1, max_size=len(names))))
        state = draw(st.sampled_from(["creating", "live", "live", "deleting", "tombstone"]))
        queues.append(_queue(f"q{k}", members, draw(st.sampled_from(members)), state))
    return nodes, queues


@given(clusters(), st.integers(0, 8), st.text(max_size=8))
def test_a_placement_is_on_distinct_active_nodes_and_the_least_loaded(
    cluster: tuple[dict[str, NodeRecord], list[QueueRecord]], replicas: int, name: str
) -> None:
    nodes, queues = cluster
    active = {n for n, r in nodes.items() if r.state == "active"}
    got = place(nodes, queues, replicas, name)
    if not 1 <= replicas <= len(active):
        assert got is None
        return
    assert got is not None
    assert len(got.members) == replicas == len(set(got.members))
    assert set(got.members) <= active and got.leader in got.members
    assert list(got.members) == sorted(got.members)
    load = loads(queues).replicas
    others = active - set(got.members)
    if others:
        assert max(load[n] for n in got.members) <= min(load[n] for n in others)


@given(clusters(), st.integers(1, 4), st.text(max_size=8), st.randoms(use_true_random=False))
def test_the_same_records_in_any_order_give_the_same_placement(
    cluster: tuple[dict[str, NodeRecord], list[QueueRecord]],
    replicas: int,
    name: str,
    rng: random.Random,
) -> None:
    nodes, queues = cluster
    shuffled_nodes = list(nodes.items())
    rng.shuffle(shuffled_nodes)
    shuffled = list(queues)
    rng.shuffle(shuffled)
    assert place(dict(shuffled_nodes), shuffled, replicas, name) == place(
        nodes, queues, replicas, name
    )
    assert replacements(dict(shuffled_nodes), shuffled, "n0") == replacements(nodes, queues, "n0")
    assert drain_plan(dict(shuffled_nodes), shuffled, "n0") == drain_plan(nodes, queues, "n0")


@given(st.integers(1, 7), st.data())
def test_queues_placed_one_after_another_stay_balanced_within_one(
    size: int, data: st.DataObject
) -> None:
    nodes = _nodes(["active"] * size)
    queues: list[QueueRecord] = []
    replicas = data.draw(st.integers(1, size))
    for k in range(data.draw(st.integers(1, 25))):
        got = place(nodes, queues, replicas, f"queue-{k}")
        assert got is not None
        queues.append(_queue(f"queue-{k}", got.members, got.leader))
        load = loads(queues)
        counts = [load.replicas[n] for n in nodes]
        assert max(counts) - min(counts) <= 1, counts
        if replicas == size:  # every node is a member: leaders can always be balanced
            leaders = [load.leaders[n] for n in nodes]
            assert max(leaders) - min(leaders) <= 1, leaders


def test_leaders_spread_over_the_members() -> None:
    nodes = _nodes(["active"] * 3)
    queues: list[QueueRecord] = []
    for k in range(30):
        got = place(nodes, queues, 3, f"q{k}")
        assert got is not None
        queues.append(_queue(f"q{k}", got.members, got.leader))
    assert sorted(loads(queues).leaders.values()) == [10, 10, 10]


@given(clusters(), st.sampled_from(["n0", "n1", "n2"]))
def test_replacements_move_every_replica_of_a_lost_node_to_a_new_active_node(
    cluster: tuple[dict[str, NodeRecord], list[QueueRecord]], lost: str
) -> None:
    nodes, queues = cluster
    moves = replacements(nodes, queues, lost)
    affected = sorted(
        q.name for q in queues if q.state in ("creating", "live") and lost in q.members
    )
    assert [m.queue for m in moves] == affected
    active = {n for n, r in nodes.items() if r.state == "active"}
    by_name = {q.name: q for q in queues}
    for move in moves:
        q = by_name[move.queue]
        assert (move.uid, move.generation, move.source) == (q.uid, q.generation, lost)
        free = active - set(q.members)
        assert (move.target is None) == (not free)
        assert move.target is None or move.target in free


def test_replacements_spread_over_the_least_loaded_nodes() -> None:
    nodes = _nodes(["lost", "active", "active", "active", "active"])
    queues = [_queue(f"q{k}", ("n0", "n1"), "n1") for k in range(6)]
    moves = replacements(nodes, queues, "n0")
    targets = sorted(m.target or "" for m in moves)
    assert targets == ["n2", "n2", "n3", "n3", "n4", "n4"]
    assert moves[0] == Move("q0", "uid-q0", 1, "n0", moves[0].target)


def test_a_drain_moves_leaders_to_other_active_members_then_replicas() -> None:
    nodes = _nodes(["draining", "active", "active", "lost"])
    queues = [
        _queue("a", ("n0", "n1", "n2"), "n0"),
        _queue("b", ("n0", "n3"), "n0"),  # no active member to lead: stays
        _queue("c", ("n1", "n2"), "n1"),
        _queue("d", ("n0", "n1"), "n0", "deleting"),
    ]
    plan = drain_plan(nodes, queues, "n0")
    assert [(m.queue, m.source) for m in plan.leaders] == [("a", "n0")]
    assert plan.leaders[0].target in ("n1", "n2")
    # n1 hosts three replicas (a, c and d, still being deleted), n2 two.
    assert [(m.queue, m.target) for m in plan.moves] == [("a", None), ("b", "n2")]
