"""The quorum rule: a majority of the voters of the configuration in force.

Every decision that counts servers asks this module (as etcd-raft's ``quorum``): whether
an election is won or lost, whether a leader still hears from a quorum (check-quorum),
which index the voters' match indexes commit, which ReadIndex round their heartbeat
answers confirm. There is one voter set at a time, never a joint one: membership changes
add or remove one server at a time (see ``config.py``), so any two consecutive
majorities overlap. Learners never count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum

from engine.ids import ServerId


def majority(voter_count: int) -> int:
    """How many voters form a quorum."""
    return voter_count // 2 + 1


class VoteResult(IntEnum):
    PENDING = 0
    WON = 1
    LOST = 2


def vote_result(voters: Sequence[ServerId], votes: Mapping[ServerId, bool]) -> VoteResult:
    """Won once a quorum granted; lost once too many refused for a quorum to grant. A
    vote from a server that is not a voter does not count."""
    granted = refused = 0
    for voter in voters:
        answer = votes.get(voter)
        if answer is True:
            granted += 1
        elif answer is False:
            refused += 1
    quorum = majority(len(voters))
    if granted >= quorum:
        return VoteResult.WON
    if refused > len(voters) - quorum:
        return VoteResult.LOST
    return VoteResult.PENDING


def has_quorum(voters: Sequence[ServerId], counts: Callable[[ServerId], bool]) -> bool:
    """A quorum of ``voters`` satisfies ``counts``."""
    return sum(1 for voter in voters if counts(voter)) >= majority(len(voters))


def committed_index(
    voters: Sequence[ServerId],
    acked: Callable[[ServerId], int],
    quorum: int | None = None,
) -> int:
    """The highest value that a quorum of ``voters`` acknowledged (at or above it): with
    match indexes, the index they commit; with read sequence numbers, the ReadIndex
    round they confirm. 0 without voters. ``quorum`` overrides the majority, for the
    deliberate fault that proves the simulator catches a wrong quorum."""
    if not voters:
        return 0
    if len(voters) == 1 and quorum in (None, 1):
        return acked(voters[0])  # one voter (every queue of a single node): nothing to sort
    values = sorted((acked(voter) for voter in voters), reverse=True)
    return values[(quorum or majority(len(voters))) - 1]


__all__ = ["VoteResult", "committed_index", "has_quorum", "majority", "vote_result"]
