"""Membership changes, learner catch-up and leadership transfer, on the leader.

Rules:
- One change at a time, one server at a time (Raft thesis section 4.1): a change is
  refused while the leader has not committed an entry of its term, while a
  configuration entry is uncommitted, or while a catch-up or change is under way.
- A server joins as a learner and is promoted to voter once it caught up (or stays a
  learner, when added as one only; a learner is promoted later the same way): it reached
  the leader's last index of one round within the minimum election timeout (thesis
  section 4.2.1), or reached the leader's last index at all. After
  ``catch_up_rounds_max`` slow rounds the addition is refused (the learner stays).
- A voter is demoted to a learner (it replicates on, votes no more) by one change of
  the voters, as a removal is; never the leader itself.
- A change completes when its configuration entry commits; a leader that removed
  itself leads until then (thesis section 4.2.2).
- Leadership transfer (thesis section 3.10): the leader stops taking proposals, brings
  the target up to date, then sends it ``TimeoutNow``; the target campaigns at once.
  The transfer completes once ``TimeoutNow`` is sent, and is refused as ``timeout``
  if that did not happen within the minimum election timeout.
- A leader that loses its role refuses every change under way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.raft import replication
from engine.raft.entry import EntryKind
from engine.raft.events import (
    AddServer,
    Completed,
    DemoteServer,
    Rejected,
    RemoveServer,
    TransferLeadership,
)
from engine.raft.messages import TimeoutNow
from engine.raft.progress import Progress

if TYPE_CHECKING:
    from engine.raft.server import RaftServer


@dataclass(slots=True)
class CatchUp:
    request_id: int
    server: ServerId
    round_target: int
    round_start_ms: int
    rounds: int
    learner_index: int
    """The index of the configuration entry that added the learner."""


@dataclass(frozen=True, slots=True)
class Change:
    request_id: int
    index: int
    """The index of the configuration entry; the change completes when it commits."""


@dataclass(slots=True)
class Transfer:
    request_id: int
    target: ServerId
    deadline_ms: int
    sent: bool = False
    """``TimeoutNow`` went to the target."""


class Membership:
    """The changes a leader has under way (at most one of each)."""

    __slots__ = ("catch_up", "change", "transfer")

    def __init__(self) -> None:
        self.catch_up: CatchUp | None = None
        self.change: Change | None = None
        self.transfer: Transfer | None = None

    def drop(self, rd_rejected: list[Rejected], rd_completed: list[Completed]) -> None:
        """The leader lost its role: refuse what is under way. A transfer counts as
        done: leadership moved, maybe to its target."""
        if self.catch_up is not None:
            rd_rejected.append(Rejected(self.catch_up.request_id, "lost_leadership", None))
        if self.change is not None:
            rd_rejected.append(Rejected(self.change.request_id, "lost_leadership", None))
        if self.transfer is not None:
            rd_completed.append(Completed(self.transfer.request_id, 0))
        self.catch_up = self.change = self.transfer = None


def _refusal(s: RaftServer) -> str | None:
    reason = s.proposal_refusal()
    if reason is not None:
        return reason
    if s.commit < s.term_start_index or s.configs[-1][0] > s.commit:
        return "change_pending"
    if s.membership.catch_up is not None or s.membership.change is not None:
        return "change_pending"
    return None


def on_add_server(s: RaftServer, event: AddServer) -> None:
    reason = _refusal(s)
    learner = event.server in s.config.learners
    if reason is None and (event.server in s.config.voters or (learner and event.learner_only)):
        reason = "bad_request"
    if reason is not None:
        s.rd.rejected.append(Rejected(event.request_id, reason, s.leader))
        return
    if learner:
        # Its catch-up starts from where it is: the entry that added it committed.
        target, added = s.log.last_index(), s.configs[-1][0]
        cu = CatchUp(event.request_id, event.server, target, s.now_ms, 1, added)
        s.membership.catch_up = cu
        maybe_promote(s, event.server, s.progress[event.server])
        return
    config = s.config.with_learner(event.server)
    index = s.append_as_leader([(EntryKind.CONFIG, config.encode())])
    s.progress[event.server] = Progress(index, s.now_ms)
    if event.learner_only:
        s.membership.change = Change(event.request_id, index)
    else:
        cu = CatchUp(event.request_id, event.server, index, s.now_ms, 1, index)
        s.membership.catch_up = cu
    replication.broadcast_append(s)


def on_remove_server(s: RaftServer, event: RemoveServer) -> None:
    reason = _refusal(s)
    config = s.config
    if reason is None and event.server not in config.members:
        reason = "bad_request"
    if reason is None and config.voters == (event.server,):
        reason = "bad_request"
    if reason is not None:
        s.rd.rejected.append(Rejected(event.request_id, reason, s.leader))
        return
    index = s.append_as_leader([(EntryKind.CONFIG, config.without(event.server).encode())])
    s.progress.pop(event.server, None)
    s.membership.change = Change(event.request_id, index)
    replication.maybe_commit(s)
    replication.broadcast_append(s)


def on_demote_server(s: RaftServer, event: DemoteServer) -> None:
    """A voter becomes a learner: like a removal it takes one server out of the voters,
    so two consecutive configurations still share a majority; unlike one, the server
    keeps its progress and goes on replicating. The leader demotes others only (a leader
    without a vote would have to step down: transfer first)."""
    reason = _refusal(s)
    config = s.config
    if reason is None and (event.server not in config.voters or event.server == s.id):
        reason = "bad_request"
    if reason is not None:
        s.rd.rejected.append(Rejected(event.request_id, reason, s.leader))
        return
    demoted = config.without(event.server).with_learner(event.server)
    index = s.append_as_leader([(EntryKind.CONFIG, demoted.encode())])
    s.membership.change = Change(event.request_id, index)
    replication.maybe_commit(s)
    replication.broadcast_append(s)


def maybe_promote(s: RaftServer, peer: ServerId, pr: Progress) -> None:
    """``peer``'s match index grew: promote it if it is the learner catching up and it
    caught up, start another round if it is slow, give up after the last round."""
    cu = s.membership.catch_up
    if cu is None or cu.server != peer or pr.match < cu.round_target:
        return
    if s.commit < cu.learner_index:
        return
    in_time = s.now_ms - cu.round_start_ms <= s.limits.election_timeout_ms_min
    if in_time or pr.match >= s.log.last_index():
        config = s.config.with_voter(peer)
        index = s.append_as_leader([(EntryKind.CONFIG, config.encode())])
        s.membership.change = Change(cu.request_id, index)
        s.membership.catch_up = None
        replication.broadcast_append(s)
        return
    if cu.rounds >= s.limits.catch_up_rounds_max:
        s.rd.rejected.append(Rejected(cu.request_id, "not_caught_up", s.id))
        s.membership.catch_up = None
        return
    cu.rounds += 1
    cu.round_target = s.log.last_index()
    cu.round_start_ms = s.now_ms


def on_commit(s: RaftServer, index: int) -> None:
    """The leader's commit index reached ``index``."""
    cu = s.membership.catch_up
    if cu is not None and cu.learner_index <= index:
        # The learner may have caught up before its entry committed; look again.
        maybe_promote(s, cu.server, s.progress[cu.server])
    change = s.membership.change
    if change is not None and change.index <= index:
        s.rd.completed.append(Completed(change.request_id, change.index))
        s.membership.change = None


def on_transfer(s: RaftServer, event: TransferLeadership) -> None:
    reason = s.proposal_refusal()
    if reason is None and (event.target == s.id or event.target not in s.config.voters):
        reason = "bad_request"
    if reason is not None:
        s.rd.rejected.append(Rejected(event.request_id, reason, s.leader))
        return
    deadline_ms = s.now_ms + s.limits.election_timeout_ms_min
    s.membership.transfer = Transfer(event.request_id, event.target, deadline_ms)
    pr = s.progress[event.target]
    if pr.match == s.log.last_index():
        _send_timeout_now(s)
    else:
        replication.maybe_send_append(s, event.target, pr, allow_empty=False)


def maybe_timeout_now(s: RaftServer, peer: ServerId, pr: Progress) -> None:
    """``peer`` answered an append: send ``TimeoutNow`` if it is the transfer's target
    and holds the whole log."""
    transfer = s.membership.transfer
    if transfer is not None and transfer.target == peer and pr.match == s.log.last_index():
        _send_timeout_now(s)


def _send_timeout_now(s: RaftServer) -> None:
    transfer = s.membership.transfer
    assert transfer is not None
    if not transfer.sent:
        transfer.sent = True
        s.rd.messages.append(TimeoutNow(src=s.id, dst=transfer.target, term=s.term))


def maybe_time_out_transfer(s: RaftServer) -> None:
    transfer = s.membership.transfer
    if transfer is not None and s.now_ms >= transfer.deadline_ms:
        s.rd.rejected.append(Rejected(transfer.request_id, "timeout", s.id))
        s.membership.transfer = None


__all__ = [
    "CatchUp",
    "Change",
    "Membership",
    "Transfer",
    "maybe_promote",
    "maybe_time_out_transfer",
    "maybe_timeout_now",
    "on_add_server",
    "on_commit",
    "on_remove_server",
    "on_transfer",
]
