"""Messages no correct peer sends: refused before the core's rules see them.

Rule: a message reaches the rules of ``election``, ``replication`` and
``snapshot_transfer`` only if it could come from a correct member of the group. A peer
may be broken, or its bytes damaged on the way; what it sends is typed and bounded by the
wire (``engine.runtime.wire``: non-negative integers, an entry's index and term at least
1), not consistent. A message that contradicts itself, this server's identity or what
this server knows of its term is dropped and counted (``RaftServer.refuse``), never
allowed to reach an assertion or to break an invariant. The assertions of the core state
its own invariants only.

Two checks, in this order:

* ``refusal``, from the message alone: it is addressed to this server by another;
  the entries of an append follow ``prev_index`` one by one, with terms that never
  decrease, from ``prev_term`` to at most the message's term; the live entries of a
  snapshot chunk are commands below the snapshot, in index order; every entry is within
  ``Limits.entry_bytes_max`` (storage asserts it) and a configuration entry decodes to a
  configuration with a voter; a candidate's last term is not past its term.
* ``refusal_in_term``, once the message's term is this server's: no other server leads
  (appends, sends heartbeats, snapshots or ``TimeoutNow``) a term this server leads or
  knows the leader of; a follower's answer does not match or
  reject an index past the leader's log, nor echo a ReadIndex round not yet started.

What only shows once several messages are put together (a snapshot whose bytes do not
decode, a missing set that does not deserialize) is refused where it is put together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.raft.config import Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotChunk,
    TimeoutNow,
    VoteRequest,
)
from engine.raft.role import Role

if TYPE_CHECKING:
    from engine.raft.server import RaftServer

_FROM_A_LEADER = (AppendRequest, Heartbeat, SnapshotChunk, TimeoutNow)


def refusal(s: RaftServer, msg: Message) -> str | None:
    """Why ``msg`` cannot come from a correct peer, judged from the message alone; or
    ``None``."""
    if msg.dst != s.id:
        return "not_addressed_here"
    if msg.src == s.id:
        return "from_this_server"
    kind = type(msg)
    if kind is AppendRequest:
        return _append_refusal(s, msg)  # type: ignore[arg-type]
    if kind is SnapshotChunk:
        return _chunk_refusal(s, msg)  # type: ignore[arg-type]
    if kind is VoteRequest and msg.last_term > msg.term:  # type: ignore[union-attr]
        return "vote_log_past_term"
    return None


def refusal_in_term(s: RaftServer, msg: Message) -> str | None:
    """Why ``msg``, of this server's term, contradicts what this server knows of the
    term; or ``None``."""
    kind = type(msg)
    if kind in _FROM_A_LEADER:
        if s.role is Role.LEADER or (s.leader is not None and s.leader != msg.src):
            return "two_leaders"
        return None
    if s.role is not Role.LEADER:
        return None
    last = s.log.last_index()
    if kind is AppendResponse:
        answer: AppendResponse = msg  # type: ignore[assignment]
        if answer.success and answer.match_index > last:
            return "match_past_log"
        if not answer.success and answer.rejected_prev_index > last:
            return "rejection_past_log"
    elif kind is HeartbeatResponse and msg.read_seq > s.reads.seq:  # type: ignore[union-attr]
        return "read_round_not_started"
    return None


def _append_refusal(s: RaftServer, msg: AppendRequest) -> str | None:
    if msg.prev_term > msg.term:
        return "append_prev_past_term"
    entries = msg.entries
    if not entries:
        return None
    # A comprehension per field (faster than one loop of tests): appends are the bulk
    # of the traffic.
    first = msg.prev_index + 1
    if [e.index for e in entries] != list(range(first, first + len(entries))):
        return "append_entries_not_in_sequence"
    terms = [e.term for e in entries]
    if terms[0] < msg.prev_term or terms != sorted(terms):
        return "append_terms_decrease"
    if terms[-1] > msg.term:
        return "append_entries_past_term"
    return _entries_refusal(s, entries)


def _chunk_refusal(s: RaftServer, msg: SnapshotChunk) -> str | None:
    if msg.snapshot_index < 1 or not 1 <= msg.snapshot_term <= msg.term:
        return "snapshot_past_term"
    index = 0
    for e in msg.entries:
        if not index < e.index <= msg.snapshot_index or e.term > msg.snapshot_term:
            return "snapshot_entries_out_of_place"
        if e.kind is not EntryKind.COMMAND:
            return "snapshot_entries_not_commands"
        index = e.index
    return _entries_refusal(s, msg.entries) if msg.entries else None


def _entries_refusal(s: RaftServer, entries: list[Entry]) -> str | None:
    if max([len(e.data) for e in entries]) > s.limits.entry_bytes_max:
        return "entry_too_large"
    config = EntryKind.CONFIG
    for e in [e for e in entries if e.kind is config]:
        parsed = Configuration.parse(e.data)
        if parsed is None or not parsed.voters:
            return "configuration_undecodable"
    return None


__all__ = ["refusal", "refusal_in_term"]
