"""The metadata group's next membership change, from its node records (pure)."""

from __future__ import annotations

from engine.cluster.meta_voters import VoterChange, next_change
from engine.cluster.records import NodeRecord, NodeState


def nodes(*spec: tuple[str, NodeState]) -> dict[str, NodeRecord]:
    """Records joined in the order given."""
    return {
        name: NodeRecord(name, f"h:{k + 1}", state, k + 1, k + 1)
        for k, (name, state) in enumerate(spec)
    }


ACTIVE: NodeState = "active"


def test_nothing_to_change_when_the_members_match_the_records() -> None:
    recs = nodes(*((n, ACTIVE) for n in ["n1", "n2", "n3"]))
    assert next_change(recs, ["n1", "n2", "n3"], [], "n1", 5, []) is None


def test_a_joined_node_is_added_as_a_learner_then_promoted() -> None:
    recs = nodes(*((n, ACTIVE) for n in ["n1", "n2", "n3", "n4"]))
    assert next_change(recs, ["n1", "n2", "n3"], [], "n1", 5, []) == VoterChange(
        "add_learner", "n4"
    )
    assert next_change(recs, ["n1", "n2", "n3"], ["n4"], "n1", 5, []) == VoterChange(
        "promote", "n4"
    )


def test_beyond_the_voter_limit_nodes_stay_learners() -> None:
    names = ["n1", "n2", "n3", "n4", "n5", "n6", "n7"]
    recs = nodes(*((n, ACTIVE) for n in names))
    voters = names[:5]
    assert next_change(recs, voters, [], "n1", 5, []) == VoterChange("add_learner", "n6")
    assert next_change(recs, voters, ["n6"], "n1", 5, []) == VoterChange("add_learner", "n7")
    assert next_change(recs, voters, ["n6", "n7"], "n1", 5, []) is None


def test_a_forgotten_member_is_removed_and_the_oldest_learner_takes_its_place() -> None:
    spec = [("n1", ACTIVE), ("n2", ACTIVE), ("n3", "forgotten"), ("n5", ACTIVE), ("n4", ACTIVE)]
    recs = nodes(*spec)
    learners = ["n4", "n5"]
    assert next_change(recs, ["n1", "n2", "n3"], learners, "n1", 3, []) == VoterChange(
        "remove", "n3"
    )
    # n5 joined before n4: it is promoted first.
    assert next_change(recs, ["n1", "n2"], learners, "n1", 3, []) == VoterChange("promote", "n5")
    assert next_change(recs, ["n1", "n2", "n5"], ["n4"], "n1", 3, []) is None


def test_a_forgotten_member_still_heard_from_stays_until_it_stops() -> None:
    recs = nodes(("n1", ACTIVE), ("n2", ACTIVE), ("n3", "forgotten"))
    assert next_change(recs, ["n1", "n2", "n3"], [], "n1", 5, ["n2", "n3"]) is None
    assert next_change(recs, ["n1", "n2", "n3"], [], "n1", 5, ["n2"]) == VoterChange("remove", "n3")


def test_the_leader_never_removes_itself_and_only_active_nodes_join_or_vote() -> None:
    spec = [("n1", "forgotten"), ("n2", ACTIVE), ("n3", "lost"), ("n4", "draining")]
    recs = nodes(*spec, ("n5", "lost"))
    assert next_change(recs, ["n1", "n2", "n3"], ["n5"], "n1", 5, []) is None
    assert next_change(recs, ["n1", "n2", "n3"], ["n5"], "n2", 5, []) == VoterChange("remove", "n1")


def test_a_draining_voter_hands_its_vote_to_an_active_learner() -> None:
    names = ["n1", "n2", "n3", "n4", "n5", "n6"]
    recs = nodes(*((n, "draining" if n == "n3" else ACTIVE) for n in names))
    voters, heard = names[:5], names
    # The learner is promoted first (one voter beyond the limit), then n3 demoted.
    assert next_change(recs, voters, ["n6"], "n1", 5, heard) == VoterChange("promote", "n6")
    assert next_change(recs, names, [], "n1", 5, heard) == VoterChange("demote", "n3")
    after = [n for n in names if n != "n3"]
    assert next_change(recs, after, ["n3"], "n1", 5, heard) is None, "it stays a learner"
    # Activated again, it votes no more while the voters are at the limit.
    active = nodes(*((n, ACTIVE) for n in names))
    assert next_change(active, after, ["n3"], "n1", 5, heard) is None


def test_a_draining_leader_transfers_its_leadership_before_it_is_demoted() -> None:
    names = ["n1", "n2", "n3", "n4"]
    recs = nodes(*((n, "draining" if n == "n1" else ACTIVE) for n in names))
    assert next_change(recs, names, [], "n1", 3, ["n3", "n4"]) == VoterChange("transfer", "n3")
    assert next_change(recs, names, [], "n1", 3, []) is None, "no active voter heard"
    assert next_change(recs, names, [], "n2", 3, []) == VoterChange("demote", "n1")


def test_a_draining_voter_with_no_learner_to_replace_it_keeps_its_vote() -> None:
    recs = nodes(("n1", ACTIVE), ("n2", ACTIVE), ("n3", "draining"))
    assert next_change(recs, ["n1", "n2", "n3"], [], "n1", 5, ["n2", "n3"]) is None
    lost = nodes(("n1", ACTIVE), ("n2", ACTIVE), ("n3", "draining"), ("n4", "lost"))
    assert next_change(lost, ["n1", "n2", "n3"], ["n4"], "n1", 3, ["n2"]) is None
