"""Linearizable reads by ReadIndex (Raft thesis section 6.4), as etcd-raft's ``readOnly``.

Rule: a read is answered once (1) the leader has committed an entry of its own term, so
its commit index covers every entry an earlier leader committed; (2) a quorum of voters
answered a heartbeat sent after the read arrived, so no other leader had been elected
then; and (3) the leader has applied the commit index it recorded for the read. Each
read takes the next sequence number; heartbeats carry the latest one and followers echo
it, so a quorum echoing ``seq`` confirms every read numbered up to ``seq``. A leader that
loses its role answers every read it holds with a rejection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.raft import quorum, replication
from engine.raft.events import ReadReady, Rejected
from engine.raft.role import Role
from engine.shared_empty import EMPTY_LIST

if TYPE_CHECKING:
    from engine.raft.server import RaftServer


class ReadOnly:
    """The reads a leader holds, in arrival order."""

    __slots__ = ("confirmed", "pending", "seq", "waiting_term_commit")

    def __init__(self) -> None:
        self.seq = 0
        """The sequence number of the latest read; heartbeats carry it."""
        # Lists, not deques: an empty deque holds a block of 64 slots (760 bytes), and
        # every replica of a node has a ``ReadOnly`` whether it is read or not.
        self.pending: list[tuple[int, int, int]] = EMPTY_LIST
        """(read seq, request id, read index), waiting for a quorum to echo the seq."""
        self.confirmed: list[tuple[int, int]] = EMPTY_LIST
        """(request id, read index), waiting for the leader to apply the index."""
        self.waiting_term_commit: list[int] = EMPTY_LIST
        """Request ids that arrived before the leader committed an entry of its term."""

    def is_empty(self) -> bool:
        return not (self.pending or self.confirmed or self.waiting_term_commit)

    def add(self, request_id: int, index: int) -> None:
        self.seq += 1
        if self.pending is EMPTY_LIST:
            self.pending = []
        self.pending.append((self.seq, request_id, index))

    def wait_term_commit(self, request_id: int) -> None:
        if self.waiting_term_commit is EMPTY_LIST:
            self.waiting_term_commit = []
        self.waiting_term_commit.append(request_id)

    def take_waiting_term_commit(self) -> list[int]:
        waiting, self.waiting_term_commit = self.waiting_term_commit, EMPTY_LIST
        return waiting

    def confirm(self, seq: int) -> None:
        """A quorum echoed ``seq``: every read numbered up to it may be answered."""
        pending = self.pending
        k = 0
        while k < len(pending) and pending[k][0] <= seq:
            _seq, request_id, index = pending[k]
            if self.confirmed is EMPTY_LIST:
                self.confirmed = []
            self.confirmed.append((request_id, index))
            k += 1
        if k:
            del pending[:k]
            if not pending:
                self.pending = EMPTY_LIST

    def take_ready(self, applied: int) -> list[ReadReady]:
        """The confirmed reads whose index is applied."""
        out: list[ReadReady] = []
        confirmed = self.confirmed
        while len(out) < len(confirmed) and confirmed[len(out)][1] <= applied:
            request_id, index = confirmed[len(out)]
            out.append(ReadReady(request_id, index))
        if out:
            del confirmed[: len(out)]
            if not confirmed:
                self.confirmed = EMPTY_LIST
        return out

    def drop(self) -> list[int]:
        """Forget every read; returns their request ids."""
        ids = [request_id for _seq, request_id, _index in self.pending]
        ids += [request_id for request_id, _index in self.confirmed]
        ids += self.waiting_term_commit
        self.pending = EMPTY_LIST
        self.confirmed = EMPTY_LIST
        self.waiting_term_commit = EMPTY_LIST
        return ids


def on_read_index(s: RaftServer, request_id: int) -> None:
    """A leader records its commit index and starts a heartbeat round (a single voter
    is its own quorum)."""
    if s.role is not Role.LEADER:
        s.rd.rejected.append(Rejected(request_id, "not_leader", s.leader))
        return
    if s.commit < s.term_start_index:
        s.reads.wait_term_commit(request_id)
        return
    s.reads.add(request_id, s.commit)
    if s.config.voters == (s.id,):
        maybe_confirm(s)
    else:
        replication.broadcast_heartbeat(s)


def on_term_committed(s: RaftServer) -> None:
    """The leader committed an entry of its term: the reads that waited for it start."""
    waiting = s.reads.take_waiting_term_commit()
    for request_id in waiting:
        on_read_index(s, request_id)


def maybe_confirm(s: RaftServer) -> None:
    """Confirm the reads whose round a quorum of voters echoed."""
    reads = s.reads
    if not reads.pending:
        return

    def acked(voter: ServerId) -> int:
        if voter == s.id:
            return reads.seq
        pr = s.progress.get(voter)
        return 0 if pr is None else pr.read_acked

    reads.confirm(quorum.committed_index(s.config.voters, acked))


__all__ = ["ReadOnly", "maybe_confirm", "on_read_index", "on_term_committed"]
