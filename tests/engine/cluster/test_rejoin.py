"""Whether a node the metadata records may join again (pure): refused where it votes,
since a voter that lost its data directory would vote with an empty log."""

from __future__ import annotations

import dataclasses

from engine.cluster.meta_commands import NodeStarted
from engine.cluster.records import NodeRecord, NodeState, QueueRecord, QueueState
from engine.cluster.rejoin import (
    LISTED_QUEUES_MAX,
    heard_refusal,
    lost_data_refusal,
    rejoin_refusal,
    started_reports,
)
from engine.queue import QueuePolicy


def node(name: str, state: NodeState = "active") -> NodeRecord:
    return NodeRecord(name, f"127.0.0.1:700{name[-1]}", state, 1, 1)


def queue(name: str, members: tuple[str, ...], state: QueueState = "live") -> QueueRecord:
    return QueueRecord(
        name, f"uid-{name}", len(members), QueuePolicy(), state, members, members[0], 1,
        members, members, members, (), 0, 1,
    )  # fmt: skip


NODES = {n: node(n) for n in ("n1", "n2", "n3", "n4")}


def test_a_node_the_metadata_does_not_know_joins() -> None:
    assert rejoin_refusal(NODES, {}, ["n1", "n2", "n3"], "n5") is None


def test_a_metadata_voter_joining_again_is_refused_with_the_way_out() -> None:
    why = rejoin_refusal(NODES, {}, ["n1", "n2", "n3"], "n3")
    assert why is not None
    assert "node n3 is already a member" in why and "the cluster's metadata" in why
    assert "empty log" in why and "/api/v1/cluster/nodes/n3/forget" in why


def test_a_member_of_a_queue_group_joining_again_is_refused_naming_its_queues() -> None:
    queues = {q: queue(q, ("n1", "n4")) for q in ("a", "b")}
    queues["c"] = queue("c", ("n1", "n2"))
    why = rejoin_refusal(NODES, queues, ["n1", "n2", "n3"], "n4")
    assert why is not None
    assert "the replica groups of 2 queues (a, b)" in why
    assert "metadata" not in why  # a learner of the metadata: no vote lost there
    many = {f"q{k}": queue(f"q{k}", ("n4",)) for k in range(LISTED_QUEUES_MAX + 2)}
    listed = rejoin_refusal(NODES, many, [], "n4")
    assert listed is not None and f"{LISTED_QUEUES_MAX + 2} queues" in listed
    assert "(q0, q1, q2, q3, q4, ...)" in listed


def test_a_queue_being_created_or_deleted_counts_a_tombstone_does_not() -> None:
    for state in ("creating", "deleting"):
        queues = {"x": queue("x", ("n4",), state)}  # type: ignore[arg-type]
        assert rejoin_refusal(NODES, queues, [], "n4") is not None
    assert rejoin_refusal(NODES, {"x": queue("x", ("n4",), "tombstone")}, [], "n4") is None


def test_a_node_that_votes_nowhere_is_answered_as_its_first_join_was() -> None:
    # Its first join committed but its answer was lost: a learner holding no replica.
    assert rejoin_refusal(NODES, {"x": queue("x", ("n1", "n2"))}, ["n1", "n2", "n3"], "n4") is None


def test_a_forgotten_node_joins_again_once_it_left_the_metadata_group() -> None:
    nodes = {**NODES, "n3": node("n3", "forgotten")}
    waiting = rejoin_refusal(nodes, {}, ["n1", "n2", "n3"], "n3")
    assert waiting is not None and "forgotten but still votes" in waiting
    assert rejoin_refusal(nodes, {}, ["n1", "n2"], "n3") is None


def test_a_node_from_another_data_directory_than_recorded_is_refused() -> None:
    started = {"n1": NodeRecord("n1", "h:1", "active", 1, 1, "d1"), "n2": node("n2")}
    assert lost_data_refusal(started, "n1", "d1") is None
    why = lost_data_refusal(started, "n1", "d9")
    assert why is not None and "another data directory" in why and "empty log" in why
    assert "/api/v1/cluster/nodes/n1/forget" in why and "--join" in why
    # Not started yet (a founder that never ran), unknown, or forgotten: not this rule's.
    assert lost_data_refusal(started, "n2", "d2") is None
    assert lost_data_refusal(started, "n5", "d5") is None
    gone = {"n1": NodeRecord("n1", "h:1", "forgotten", 1, 2, "d1")}
    assert lost_data_refusal(gone, "n1", "d9") is None


def test_the_data_directories_heard_are_recorded_for_nodes_without_one() -> None:
    """What a metadata leader proposes from the handshakes it heard (and its own): a
    node recorded without a data directory, or being added with the formation; not one
    recorded with one already (another is refused by ``lost_data_refusal``), a
    forgotten one, an unknown one, or an empty id."""
    nodes = {
        "n1": node("n1"),
        "n2": dataclasses.replace(node("n2"), incarnation="d2"),
        "n3": node("n3", "forgotten"),
        "n4": node("n4"),
    }
    heard = {"n1": "d1", "n2": "other", "n3": "d3", "n4": "", "n5": "d5", "n6": "d6"}
    assert started_reports(nodes, heard) == [NodeStarted("n1", "d1")]
    assert started_reports(nodes, heard, adding=("n5",)) == [
        NodeStarted("n1", "d1"),
        NodeStarted("n5", "d5"),
    ]
    assert started_reports({}, {}, adding=("n1",)) == []


def test_a_founder_heard_from_another_data_directory_is_refused_before_it_is_recorded() -> None:
    """Between its first handshake and the metadata's record of it (a pass, about a
    second), a founder back from another data directory is refused by a peer that heard
    it from the first one: it may have voted or acknowledged over that connection."""
    founders = ("n1", "n2", "n3")
    heard = {"n1": "d1", "n3": "d3", "n4": "d4"}
    for nodes in ({}, NODES):  # before the formation applied here, and after it
        why = heard_refusal(nodes, heard, founders, "n3", "d9")
        assert why is not None and "another data directory" in why and "empty log" in why
        assert "/api/v1/cluster/nodes/n3/forget" in why and "--join" in why
        assert heard_refusal(nodes, heard, founders, "n3", "d3") is None  # the same one
        assert heard_refusal(nodes, heard, founders, "n2", "d2") is None  # not heard yet
    # Not a founder: a join that crashed before writing its identity comes back from a
    # new directory, and is answered as its first join was (``rejoin_refusal``).
    assert heard_refusal(NODES, heard, founders, "n4", "d9") is None
    # Once the metadata records the node, the records decide (``lost_data_refusal``).
    recorded = {"n3": dataclasses.replace(node("n3"), incarnation="d3")}
    assert heard_refusal(recorded, heard, founders, "n3", "d9") is None
    assert heard_refusal({"n3": node("n3", "forgotten")}, heard, founders, "n3", "d9") is None
