"""Messages between the Raft servers of one group. Frozen values; the runtime moves them.

Constructors take keywords only (``AppendResponse(term=..., success=...)``): a message
has many integer fields of the same type, and a keyword cannot be put in the wrong place.

Every message names its sender, its receiver and the sender's term. The core never
assumes delivery, order or uniqueness: the network may drop, delay, reorder and repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.ids import ServerId
from engine.raft.entry import Entry

INT_MAX = (1 << 62) - 1
"""Terms, indexes, offsets and times in a message are at most this: storage keeps them
as unsigned 64-bit numbers, with room for what the core adds to them (the next term)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteRequest:
    src: ServerId
    dst: ServerId
    term: int
    last_index: int
    last_term: int
    pre: bool
    """A pre-vote: asks whether a vote would be granted, changes no term."""
    transfer: bool
    """Sent on a leadership transfer: voters ignore their leader lease."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VoteResponse:
    src: ServerId
    dst: ServerId
    term: int
    granted: bool
    pre: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequest:
    src: ServerId
    dst: ServerId
    term: int
    prev_index: int
    prev_term: int
    entries: list[Entry]
    commit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendResponse:
    src: ServerId
    dst: ServerId
    term: int
    success: bool
    match_index: int
    """On success, the last index known to match the leader's log."""
    rejected_prev_index: int
    """On failure, the ``prev_index`` the follower could not match."""
    conflict_term: int
    """On failure, the follower's term at ``rejected_prev_index`` (0: it has no entry)."""
    conflict_index: int
    """On failure, the first index of ``conflict_term`` in the follower's log, or its
    last index + 1 when the log is too short."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    src: ServerId
    dst: ServerId
    term: int
    commit: int
    """``min(commit, match of this follower)``: safe to adopt without a log check."""
    read_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse:
    src: ServerId
    dst: ServerId
    term: int
    read_seq: int
    repairing: bool = False
    """The follower is in repair mode: it takes a commit index only from an append that
    passed its log check, so the leader sends one (empty if there is nothing new)."""
    last_index: int = 0
    """The last entry in the follower's log, durable or not: what it has received."""
    last_term: int = 0
    """That entry's term. Of the leader's term, the log up to ``last_index`` is the
    leader's (log matching): every append sent up to there arrived."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotChunk:
    src: ServerId
    dst: ServerId
    term: int
    snapshot_index: int
    snapshot_term: int
    offset: int
    """Offsets ``0 .. len(checkpoint bytes)`` address the checkpoint's bytes; past them,
    ``len(checkpoint bytes) + k`` is the ``k``-th live entry the follower lacks."""
    data: bytes
    """A piece of the checkpoint's bytes (empty in a message of live entries)."""
    done: bool
    """The last piece of the checkpoint, or the last live entries the follower lacks."""
    entries: list[Entry] = field(default_factory=list)
    """Live entries before the snapshot that the follower lacks, in index order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotResponse:
    src: ServerId
    dst: ServerId
    term: int
    snapshot_index: int
    next_offset: int
    """The offset the follower wants next; ``-1`` once the snapshot is installed."""
    missing: bytes = b""
    """Once the checkpoint is in (answering a piece of it): the serialized ``BitMap64``
    of its live indexes this follower lacks; the leader sends only those."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutNow:
    """Leadership transfer: the receiver campaigns at once, skipping the pre-vote."""

    src: ServerId
    dst: ServerId
    term: int


Message = (
    VoteRequest
    | VoteResponse
    | AppendRequest
    | AppendResponse
    | Heartbeat
    | HeartbeatResponse
    | SnapshotChunk
    | SnapshotResponse
    | TimeoutNow
)

__all__ = [
    "INT_MAX",
    "AppendRequest",
    "AppendResponse",
    "Heartbeat",
    "HeartbeatResponse",
    "Message",
    "SnapshotChunk",
    "SnapshotResponse",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]
