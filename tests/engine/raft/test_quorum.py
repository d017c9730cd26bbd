"""The one quorum rule: majorities, elections, the committed index."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.raft.quorum import VoteResult, committed_index, has_quorum, majority, vote_result
from tests.engine.raft.harness import sid

A, B, C, D, E = (sid(n) for n in "abcde")


def test_a_majority_of_voters() -> None:
    assert [majority(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_an_election_is_won_by_a_quorum_and_lost_once_no_quorum_can_grant() -> None:
    voters = (A, B, C, D, E)
    assert vote_result(voters, {A: True}) is VoteResult.PENDING
    assert vote_result(voters, {A: True, B: True, C: True}) is VoteResult.WON
    assert vote_result(voters, {A: True, B: False, C: False}) is VoteResult.PENDING
    assert vote_result(voters, {A: True, B: False, C: False, D: False}) is VoteResult.LOST


def test_a_vote_from_a_non_voter_does_not_count() -> None:
    assert vote_result((A, B, C), {A: True, D: True, E: True}) is VoteResult.PENDING
    assert vote_result((A, B, C), {A: True, D: False, E: False}) is VoteResult.PENDING


def test_the_committed_index_is_what_a_quorum_holds() -> None:
    acked = {A: 9, B: 7, C: 3, D: 0}
    assert committed_index((A, B, C), acked.__getitem__) == 7
    assert committed_index((A, B, C, D), acked.__getitem__) == 3
    assert committed_index((A,), acked.__getitem__) == 9
    assert committed_index((), acked.__getitem__) == 0
    assert committed_index((A, B, C), acked.__getitem__, quorum=1) == 9


def test_has_quorum_counts_voters_only() -> None:
    assert has_quorum((A, B, C), {A, B}.__contains__)
    assert not has_quorum((A, B, C), {A, D, E}.__contains__)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=9))
def test_committed_index_matches_a_plain_model(values: list[int]) -> None:
    """The highest index at least a majority of voters acknowledged."""
    voters = tuple(sid(f"s{i}") for i in range(len(values)))
    acked = dict(zip(voters, values, strict=True))
    q = majority(len(voters))
    model = max(v for v in [0, *values] if sum(1 for x in values if x >= v) >= q)
    assert committed_index(voters, acked.__getitem__) == model
