"""Log replication (Raft section 5.3): the leader's appends and heartbeats, and a
follower's answers.

Rules:
- The leader sends each follower what its ``Progress`` says it lacks, paced by flow
  control (``progress.py``): one probe at a time until a follower's log matches, then a
  pipeline bounded by in-flight messages and bytes. Proposals stepped before one
  ``Ready`` go to each follower in one append (``RaftServer.append_due``). Entries compacted away are sent as a
  snapshot instead (``snapshot_transfer``).
- A follower accepts entries only after the entry before them matches (log matching);
  on a mismatch it answers with a hint of where its log diverges, so the leader skips a
  term at a time. A committed entry is never overwritten.
- The leader commits the highest index a quorum of voters holds durably (itself up to
  what its storage reported durable), and only if that entry is of its own term
  (section 5.4.2). Heartbeats carry ``min(commit, match)``, which a follower adopts
  without a log check, and the ReadIndex sequence number.
- A follower answers appends after what they made it write is durable; it answers
  heartbeats at once (they depend on nothing unpersisted). Appends taken in one ``Ready``
  are answered by one success, the last: the leader frees its in-flight slots up to the
  match it names, so the earlier ones tell it nothing more.
- Every heartbeat interval the leader resends what may be lost: a probe without answer,
  a pipeline that made no progress for ``append_stall_ms``, a snapshot chunk. A
  follower's heartbeat answer names the last entry it holds, durable or not: while
  appends keep arriving, or all have, the pipeline is slow to persist, not lost, and is
  not sent again (under load a follower's fsync can take longer than two heartbeat
  intervals, and resending all in flight then doubled the entries sent). A lost append
  in the middle is found sooner anyway: the next one fails the log check and is refused.
- The periodic heartbeat to a follower with an append unanswered, sent and answered
  within the interval, is left out (``busy``): the appends do its work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.raft import membership, quorum, read_only, snapshot_transfer
from engine.raft.config import Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
)
from engine.raft.options import Fault
from engine.raft.progress import Progress, ProgressState
from engine.raft.role import Role

if TYPE_CHECKING:
    from engine.raft.server import RaftServer

# --- leader side ----------------------------------------------------------------------


def unstick_followers(s: RaftServer) -> None:
    """Resend what was lost: a probe that got no answer, a silent pipeline, a chunk."""
    last = s.log.last_index()
    stall_ms = s.limits.append_stall_ms
    for peer, pr in s.progress.items():
        if pr.state is ProgressState.PROBE:
            pr.probe_sent = False
            maybe_send_append(s, peer, pr, allow_empty=False)
        elif pr.state is ProgressState.REPLICATE:
            if pr.match < last and s.now_ms - pr.last_progress_ms >= stall_ms:
                pr.become_probe(pr.match + 1)
                maybe_send_append(s, peer, pr, allow_empty=True)
        elif s.now_ms - pr.snapshot_sent_ms >= stall_ms:
            snapshot_transfer.send_chunk(s, peer, pr)


def broadcast_append(s: RaftServer) -> None:
    for peer, pr in s.progress.items():
        maybe_send_append(s, peer, pr, allow_empty=False)
    if not s.progress:
        maybe_commit(s)


def broadcast_heartbeat(s: RaftServer, *, periodic: bool = False) -> None:
    """A heartbeat to each follower; a ``periodic`` round (not a read's) skips those that
    ``busy`` says need none."""
    for peer, pr in s.progress.items():
        if periodic and busy(s, pr):
            continue
        hb = Heartbeat(
            src=s.id,
            dst=peer,
            term=s.term,
            commit=min(s.commit, pr.match),
            read_seq=s.reads.seq,
        )
        s.rd.messages.append(hb)


def busy(s: RaftServer, pr: Progress) -> bool:
    """Whether a follower's appends do what a heartbeat would, so that the periodic one
    is left out: an append sent to it within the last heartbeat interval (which reset
    its election timer and carried a commit index) is still unanswered, so an answer is
    to come, and its match moved within the interval, so the pipeline is alive without
    the heartbeat answer's word on what arrived; and no read waits for a round. A
    follower so still hears from its leader within two intervals (below the shortest
    election timeout), and learns the commit index with the next append, or the next
    heartbeat once its appends are all answered. Under a steady publish each heartbeat
    and its answer were one message more each way (a wake-up, an encode, a decode and a
    step) per follower per interval."""
    interval = s.limits.heartbeat_interval_ms
    now = s.now_ms
    return (
        pr.state is ProgressState.REPLICATE
        and bool(pr.inflight)
        and now - pr.append_sent_ms < interval
        and now - pr.last_match_ms < interval
        and not s.reads.pending
    )


def maybe_send_append(s: RaftServer, peer: ServerId, pr: Progress, allow_empty: bool) -> bool:
    """Send ``peer`` the entries it lacks (or the snapshot, if they are compacted
    away), unless flow control holds it; says whether a message went."""
    limits = s.limits
    if pr.is_paused(
        limits.inflight_messages_per_follower_max, limits.inflight_bytes_per_follower_max
    ):
        return False
    log = s.log
    last = log.last_index()
    if pr.next > last and not allow_empty and pr.state is ProgressState.REPLICATE:
        return False
    prev = pr.next - 1
    prev_term = log.term(prev)
    if prev_term is None:
        return snapshot_transfer.begin(s, peer, pr)
    try:
        entries = log.entries(
            pr.next,
            last + 1,
            limits.append_bytes_per_message_max,
            limits.append_entries_per_message_max,
        )
    except LookupError:
        return snapshot_transfer.begin(s, peer, pr)
    size = 0
    for e in entries:
        size += len(e.data)
    msg = AppendRequest(
        src=s.id,
        dst=peer,
        term=s.term,
        prev_index=prev,
        prev_term=prev_term,
        entries=entries,
        commit=s.commit,
    )
    s.rd.messages.append(msg)
    pr.sent(prev + len(entries), size)
    pr.append_sent_ms = s.now_ms
    return True


def on_append_response(s: RaftServer, msg: AppendResponse) -> None:
    pr = s.heard_from_follower(msg.src)
    if pr is None:
        return
    if not msg.success:
        _on_append_rejected(s, msg, pr)
        return
    updated = pr.maybe_update(msg.match_index, s.now_ms)
    if pr.state is ProgressState.PROBE:
        pr.become_replicate()
    if updated:
        if msg.src in s.config.voters:
            maybe_commit(s)
        membership.maybe_promote(s, msg.src, pr)
    membership.maybe_timeout_now(s, msg.src, pr)
    while maybe_send_append(s, msg.src, pr, allow_empty=False):
        if pr.next > s.log.last_index():
            break


def _on_append_rejected(s: RaftServer, msg: AppendResponse, pr: Progress) -> None:
    if msg.rejected_prev_index < pr.match:
        return
    if pr.state is ProgressState.SNAPSHOT:
        return
    next_index = msg.conflict_index
    if msg.conflict_term > 0:
        found = s.log.last_index_of_term(msg.conflict_term, msg.rejected_prev_index)
        if found:
            next_index = found + 1
    next_index = min(next_index, msg.rejected_prev_index)
    pr.become_probe(max(next_index, 1))
    maybe_send_append(s, msg.src, pr, allow_empty=True)


def maybe_commit(s: RaftServer) -> None:
    """Commit what a quorum of voters holds durably, if it is of this term."""

    def acked(voter: ServerId) -> int:
        if voter == s.id:
            return s.log.stable_last
        pr = s.progress.get(voter)
        return 0 if pr is None else pr.match

    size = None
    if s.options.fault is Fault.COMMIT_QUORUM_OFF_BY_ONE:
        size = max(1, quorum.majority(len(s.config.voters)) - 1)
    candidate = quorum.committed_index(s.config.voters, acked, size)
    if candidate <= s.commit:
        return
    if s.log.term(candidate) != s.term and s.options.fault is not Fault.COMMIT_ANY_TERM:
        return
    _commit_to(s, candidate)


def _commit_to(s: RaftServer, index: int) -> None:
    s.commit = index
    uncommitted = s.uncommitted
    k = 0
    while k < len(uncommitted) and uncommitted[k][0] <= index:
        s.uncommitted_bytes -= uncommitted[k][1]
        k += 1
    if k:
        del uncommitted[:k]
        if not uncommitted:
            s.forget_uncommitted()
    membership.on_commit(s, index)
    if s.reads.waiting_term_commit and index >= s.term_start_index:
        read_only.on_term_committed(s)
    removed = s.role is Role.LEADER and s.id not in s.config.voters
    if removed and s.configs[-1][0] <= index:
        # A leader that removed itself leads until the change commits (thesis 4.2.2).
        s.become_follower(s.term, None)


# --- follower side --------------------------------------------------------------------


def on_heartbeat(s: RaftServer, msg: Heartbeat) -> None:
    s.heard_from_leader(msg.src)
    if msg.commit > s.commit and not s.repairing:
        s.commit = min(msg.commit, s.log.last_index())
    log = s.log
    resp = HeartbeatResponse(
        src=s.id,
        dst=msg.src,
        term=s.term,
        read_seq=msg.read_seq,
        repairing=s.repairing,
        last_index=log.last_index(),
        last_term=log.last_term(),
    )
    s.rd.messages.append(resp)


def on_heartbeat_response(s: RaftServer, msg: HeartbeatResponse) -> None:
    pr = s.heard_from_follower(msg.src)
    if pr is None:
        return
    if msg.read_seq > pr.read_acked:
        pr.read_acked = msg.read_seq
        read_only.maybe_confirm(s)
    if pr.state is ProgressState.REPLICATE and msg.last_term == s.term:
        pr.maybe_arrived(msg.last_index, s.now_ms, s.limits.append_unacked_ms_max)
    if pr.match < s.log.last_index() and pr.state is ProgressState.PROBE:
        maybe_send_append(s, msg.src, pr, allow_empty=False)
    elif msg.repairing and pr.state is not ProgressState.SNAPSHOT:
        maybe_send_append(s, msg.src, pr, allow_empty=True)


def on_append_request(s: RaftServer, msg: AppendRequest) -> None:
    s.heard_from_leader(msg.src)
    prev, entries = msg.prev_index, msg.entries
    if prev < s.commit:
        # Entries up to our commit index match the leader's (they are committed);
        # keep only what follows it.
        entries = entries[s.commit - prev :]
        prev = s.commit
    elif not s.log.matches(prev, msg.prev_term):
        _reject_append(s, msg)
        return
    last_new = prev + len(entries)
    if entries:
        _append_new_entries(s, entries)
    if msg.commit > s.commit:
        s.commit = min(msg.commit, last_new)
    answer_append(s, msg.src, success=True, match_index=last_new)


def _append_new_entries(s: RaftServer, entries: list[Entry]) -> None:
    log = s.log
    last = log.last_index()
    n = 0
    for e in entries:
        if e.index > last or log.term(e.index) != e.term:
            break
        n += 1
    if n == len(entries):
        return
    fresh = entries[n:] if n else entries
    first = fresh[0].index
    assert first > s.commit, "a committed entry is never overwritten"
    if first <= last:
        s.configs = [(i, c) for i, c in s.configs if i < first]
    log.append(fresh)
    # A leader stamps in increasing order: the last entry holds the newest stamp.
    s.stamp_ms = max(s.stamp_ms, fresh[-1].now_ms)
    for e in fresh:
        if e.kind is EntryKind.CONFIG:
            s.configs.append((e.index, Configuration.decode(e.data)))


def _reject_append(s: RaftServer, msg: AppendRequest) -> None:
    """Refuse with a hint of where our log diverges: the first index of our term at
    ``prev_index``, or our last index + 1 when the log is too short."""
    log = s.log
    prev = msg.prev_index
    last = log.last_index()
    if prev > last:
        conflict_term, conflict_index = 0, last + 1
    else:
        conflict_term = log.term(prev) or 0
        conflict_index = prev
        while conflict_index - 1 > max(s.commit, log.snapshot_index) and (
            log.term(conflict_index - 1) == conflict_term
        ):
            conflict_index -= 1
    answer_append(
        s,
        msg.src,
        success=False,
        rejected_prev_index=prev,
        conflict_term=conflict_term,
        conflict_index=conflict_index,
    )


def supersedes(message: Message, last: Message) -> bool:
    """Whether ``message``, sent right after ``last``, says all ``last`` did: both
    successful append answers to one leader in one term, ``message`` matching as far or
    further (so ``last`` need not be sent)."""
    return (
        type(message) is AppendResponse
        and message.success
        and type(last) is AppendResponse
        and last.success
        and last.dst == message.dst
        and last.term == message.term
        and last.match_index <= message.match_index
    )


def answer_append(
    s: RaftServer,
    leader: ServerId,
    success: bool,
    match_index: int = 0,
    rejected_prev_index: int = 0,
    conflict_term: int = 0,
    conflict_index: int = 0,
) -> None:
    """Answer an append once what it depends on is durable."""
    resp = AppendResponse(
        src=s.id,
        dst=leader,
        term=s.term,
        success=success,
        match_index=match_index,
        rejected_prev_index=rejected_prev_index,
        conflict_term=conflict_term,
        conflict_index=conflict_index,
    )
    waiting = s.rd.messages_after_persist
    if waiting and supersedes(resp, waiting[-1]):
        waiting[-1] = resp  # it says all the earlier one did
        return
    waiting.append(resp)


__all__ = [
    "answer_append",
    "broadcast_append",
    "broadcast_heartbeat",
    "busy",
    "maybe_commit",
    "maybe_send_append",
    "on_append_request",
    "on_append_response",
    "on_heartbeat",
    "on_heartbeat_response",
    "supersedes",
    "unstick_followers",
]
