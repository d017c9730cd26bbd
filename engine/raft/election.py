"""Leader election (Raft section 5.2) with pre-vote and the leader lease.

Rules:
- A campaign is a pre-vote first (unless pre-vote is off or the campaign is a leadership
  transfer): it asks for votes in the next term without taking it, so a server that
  cannot win does not disturb the group; only a won pre-vote starts the real election.
- A vote (or pre-vote) is granted only to a candidate whose log is at least as
  up-to-date as the voter's (section 5.4.1); a real vote only once per term.
- A repairing server grants no vote or pre-vote and never campaigns (see server.py).
- The quorum arithmetic is ``quorum.vote_result``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.raft import quorum
from engine.raft.messages import VoteRequest, VoteResponse
from engine.raft.role import Role

if TYPE_CHECKING:
    from engine.raft.server import RaftServer


def campaign(s: RaftServer, transfer: bool) -> None:
    """Start a campaign: a pre-vote unless it is off or this is a transfer."""
    pre = s.options.pre_vote and not transfer
    s.leader = None
    s.reset_election_timer()
    _request_votes(s, pre, transfer)


def _request_votes(s: RaftServer, pre: bool, transfer: bool) -> None:
    s.role = Role.PRE_CANDIDATE if pre else Role.CANDIDATE
    if not pre:
        s.term += 1
        s.vote = s.id
    s.votes = {s.id: True}
    if quorum.vote_result(s.config.voters, s.votes) is quorum.VoteResult.WON:
        _won(s, pre)
        return
    term = s.term + 1 if pre else s.term
    last_index, last_term = s.log.last_index(), s.log.last_term()
    for voter in s.config.voters:
        if voter != s.id:
            req = VoteRequest(
                src=s.id,
                dst=voter,
                term=term,
                last_index=last_index,
                last_term=last_term,
                pre=pre,
                transfer=transfer,
            )
            s.rd.messages_after_persist.append(req)


def _won(s: RaftServer, pre: bool) -> None:
    if pre:
        _request_votes(s, pre=False, transfer=False)
    else:
        s.become_leader()


def on_vote_request(s: RaftServer, msg: VoteRequest) -> None:
    if s.repairing:
        reply_vote(s, msg, False)
        return
    log = s.log
    up_to_date = (msg.last_term, msg.last_index) >= (log.last_term(), log.last_index())
    free = s.vote == msg.src or (s.vote is None and s.leader is None)
    if msg.pre:
        reply_vote(s, msg, up_to_date and (msg.term > s.term or free))
        return
    granted = up_to_date and free
    if granted:
        s.vote = msg.src
        s.reset_election_timer()
    reply_vote(s, msg, granted)


def reply_vote(s: RaftServer, msg: VoteRequest, granted: bool) -> None:
    resp = VoteResponse(
        src=s.id, dst=msg.src, term=msg.term if granted else s.term, granted=granted, pre=msg.pre
    )
    s.rd.messages_after_persist.append(resp)


def on_vote_response(s: RaftServer, msg: VoteResponse) -> None:
    expected = Role.PRE_CANDIDATE if msg.pre else Role.CANDIDATE
    if s.role is not expected:
        return
    if msg.pre and msg.term != s.term + 1 and msg.granted:
        return
    s.votes[msg.src] = msg.granted
    result = quorum.vote_result(s.config.voters, s.votes)
    if result is quorum.VoteResult.WON:
        _won(s, msg.pre)
    elif result is quorum.VoteResult.LOST:
        s.become_follower(s.term, None)


__all__ = ["campaign", "on_vote_request", "on_vote_response", "reply_vote"]
