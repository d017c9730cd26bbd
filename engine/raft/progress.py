"""What a leader knows of one follower: match and next index, and the flow control state.

States (as etcd-io/raft): PROBE sends one message and waits for its answer; REPLICATE
pipelines optimistically, bounded by in-flight messages and bytes; SNAPSHOT ships a
snapshot's checkpoint in chunks, then the live entries the follower lacks, one message in
flight.
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum

from pyroaring import BitMap64

NEVER_MS = -(1 << 62)
"""A time before any clock's first reading."""


class ProgressState(IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    __slots__ = (
        "append_sent_ms",
        "heard_ms",
        "inflight",
        "inflight_bytes",
        "last_match_ms",
        "last_progress_ms",
        "match",
        "next",
        "probe_sent",
        "read_acked",
        "received",
        "recent_active",
        "snapshot_data",
        "snapshot_index",
        "snapshot_missing",
        "snapshot_offset",
        "snapshot_sent_ms",
        "snapshot_term",
        "state",
    )

    def __init__(self, next_index: int, now_ms: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: deque[tuple[int, int]] = deque()
        """(last index, bytes) of each append message not yet acknowledged."""
        self.inflight_bytes = 0
        self.recent_active = True
        """Answered since the last check of the quorum (which clears it on every peer)."""
        self.heard_ms = now_ms
        """When the follower last answered (a new progress counts as an answer): unlike
        ``recent_active``, not cleared by the checks of the quorum, so a follower that
        answers does not look silent in the moment after each."""
        self.read_acked = 0
        self.last_match_ms = now_ms
        """When the match last advanced."""
        self.last_progress_ms = now_ms
        """When the pipeline last moved: a match advanced, or more appends were seen to
        have arrived (``maybe_arrived``). ``Limits.append_stall_ms`` without either:
        something was lost."""
        self.received = 0
        """The highest last index of the leader's term a follower said it holds."""
        self.append_sent_ms = NEVER_MS
        """When the leader last sent this follower an append (``replication.busy``)."""
        self.snapshot_data = b""
        self.snapshot_index = 0
        self.snapshot_missing: BitMap64 | None = None
        """The live indexes the follower lacks, once it has said so."""
        self.snapshot_term = 0
        self.snapshot_offset = 0
        self.snapshot_sent_ms = 0

    def is_paused(self, inflight_max: int, inflight_bytes_max: int) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return len(self.inflight) >= inflight_max or self.inflight_bytes >= inflight_bytes_max

    def sent(self, last_index: int, size_bytes: int) -> None:
        if self.state is ProgressState.REPLICATE:
            if last_index >= self.next:
                self.next = last_index + 1
                self.inflight.append((last_index, size_bytes))
                self.inflight_bytes += size_bytes
        else:
            self.probe_sent = True

    def maybe_update(self, match: int, now_ms: int) -> bool:
        """A success up to ``match``; says whether it taught us anything new."""
        updated = match > self.match
        if updated:
            self.match = match
            self.last_match_ms = self.last_progress_ms = now_ms
        self.next = max(self.next, match + 1)
        self.probe_sent = False
        inflight = self.inflight
        while inflight and inflight[0][0] <= match:
            self.inflight_bytes -= inflight.popleft()[1]
        return updated

    def maybe_arrived(self, last_index: int, now_ms: int, unacked_ms_max: int) -> bool:
        """The follower holds the leader's log up to ``last_index``, durable or not (an
        entry of the leader's term ends it). If more arrived since it last said so, or
        every append sent did, the pipeline is alive however slowly the follower
        persists, unless its match has not moved for ``unacked_ms_max`` (what it holds
        may never become durable: a failed or damaged disk); says whether it is."""
        moved = last_index > self.received
        if moved:
            self.received = last_index
        alive = moved or last_index >= self.next - 1
        alive = alive and now_ms - self.last_match_ms < unacked_ms_max
        if alive:
            self.last_progress_ms = now_ms
        return alive

    def become_probe(self, next_index: int) -> None:
        self.state = ProgressState.PROBE
        self.next = max(self.match + 1, next_index)
        self.probe_sent = False
        self.inflight.clear()
        self.inflight_bytes = 0
        self.snapshot_data = b""
        self.snapshot_missing = None

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()
        self.inflight_bytes = 0

    def become_snapshot(self, index: int, term: int, data: bytes, now_ms: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.inflight.clear()
        self.inflight_bytes = 0
        self.snapshot_index, self.snapshot_term = index, term
        self.snapshot_data = data
        self.snapshot_missing = None
        self.snapshot_offset = 0
        self.snapshot_sent_ms = now_ms


__all__ = ["Progress", "ProgressState"]
