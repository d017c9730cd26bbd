"""Leader election (Raft section 5.2) with pre-vote and the leader lease.

Rules:
- A campaign is a pre-vote first (unless pre-vote is off or the campaign is a leadership
  transfer): it asks for votes in the next term without taking it, so a server that
  cannot win does not disturb the group; only a won pre-vote starts the real election.
- A vote (or pre-vote) is granted only to a candidate whose log is at least as
  up-to-date as the voter's (section 5.4.1); a real vote only once per term.
- A repairing server grants no vote or pre-vote and never campaigns (see server.py).
- The quorum arithmetic is ``quorum.vote_result``'s.
- A sole voter rebuilt from storage may lead again in its durable term without a
  campaign (``resume_as_sole_leader``), only when its caller knows that every entry it
  appended in that term is stored: see there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.raft import quorum, replication
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


def resume_as_sole_leader(s: RaftServer) -> bool:
    """Lead again in the current term, without a campaign or a first entry, if ``s`` is
    a server just made from storage that is the only member of its group, led in this
    term before (its vote is its own, its log ends with an entry of this term) and
    stepped nothing since (its term and vote are the durable ones, its log all stored).
    Whether it did; if not, it campaigns as usual at its election timeout.

    The caller must know what the core cannot: that every entry this server appended
    in the term is stored (a replica woken from its sleeping record: it slept with
    nothing unwritten). After a crash that is not so: an entry of the term appended and
    lost could be appended again with other data at the same index and term, against
    log matching, so a restart after a crash campaigns for a new term.

    Why it is safe then: no other server can lead this term (the vote is this one's,
    and there is no other voter); the log is the one the server led with, so nothing
    it held is overwritten; the term and vote it acts in are durable, so nothing is
    acknowledged in a term a crash could take back. Its entries are committed at once
    (a quorum of one holds them durably, and the last one is of this term), which is
    also what the first entry of a new term would have confirmed."""
    log = s.log
    last = log.last_index()
    hs = s.hard_state_out
    if s.role is not Role.FOLLOWER or s.repairing or s.leader is not None:
        return False
    if s.config.members != (s.id,) or s.vote != s.id or (hs.term, hs.vote) != (s.term, s.id):
        return False
    if last == 0 or log.unstable or log.stable_last != last or log.term(last) != s.term:
        return False
    s.start_leading()
    # Its commit check: the last entry is of this term (no first entry is appended).
    s.term_start_index = last
    replication.maybe_commit(s)
    return True


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


__all__ = [
    "campaign",
    "on_vote_request",
    "on_vote_response",
    "reply_vote",
    "resume_as_sole_leader",
]
