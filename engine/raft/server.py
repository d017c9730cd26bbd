"""The Raft server as a pure object: ``step(event)`` changes it, ``ready()`` says what to do.

Rules kept here:

- No I/O, clock or randomness of its own: time comes from ``Tick``, chance from the
  ``RandomSource`` passed in, durability from ``Persisted``.
- A message that depends on unpersisted state goes out only after it is durable
  (``Ready.messages_after_persist``); the leader counts itself toward a quorum only up to
  what its own storage reported durable.
- Only entries of the current term are committed by counting replicas (Raft section 5.4.2).
- Pre-vote and check-quorum: a server that cannot win does not disturb the term, and a
  voter that heard from a leader within the minimum election timeout ignores campaigns
  (its leader lease), unless the campaign is a leadership transfer.
- Reads are linearizable by ReadIndex: the leader records its commit index, confirms it
  still leads with one heartbeat round to a quorum, and answers once it has applied it.
- Repair mode (``repair=True``: storage lost durable entries of this server, or maybe its
  hard state). Such a server may have acknowledged entries, or voted, and no longer know
  it, so until it is repaired it grants no vote or pre-vote, never campaigns, and counts
  as committed only what a leader confirmed after a log check (a heartbeat's commit
  assumes the leader's match index, which may predate the damage). It starts one term
  above the recovered one: a leader that counted its acknowledgements from before the
  damage has a lower term and steps down on its first answer, so every leader it answers
  in repair counts only what it really holds. It leaves repair once it stores a
  committed entry of the current leader's term: that leader holds every entry committed
  in an earlier term, and none of its own commits counted this server's lost
  acknowledgements. Leaving, it records a vote for that leader in that term (it may have
  voted in it before the damage) and ``Ready.repaired`` says so; storage keeps its
  repair marker until that hard state is durable.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from pyroaring import BitMap64

from engine.errors import RecoveryRefused
from engine.ids import ServerId
from engine.limits import DEFAULT_LIMITS, Limits
from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.events import (
    Accepted,
    AddServer,
    Completed,
    Event,
    HardState,
    Persisted,
    Propose,
    ReadIndex,
    ReadReady,
    Ready,
    Receive,
    Rejected,
    RemoveServer,
    SnapshotInstalled,
    SnapshotTaken,
    Tick,
    TransferLeadership,
)
from engine.raft.log import Entry, EntryKind, LogStore
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    Message,
    SnapshotChunk,
    SnapshotResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from engine.raft.progress import Progress, ProgressState
from engine.raft.raft_log import RaftLog
from engine.raft.snapshot import Snapshot, SnapshotMeta


class RandomSource(Protocol):
    """What the core needs of a ``random.Random`` (which satisfies it)."""

    def randint(self, a: int, b: int) -> int: ...


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class Fault(IntEnum):
    """Deliberate bugs, for tests that prove the simulator's checkers catch them."""

    NONE = 0
    COMMIT_ANY_TERM = 1
    """Commit entries of earlier terms by counting replicas (breaks Raft section 5.4.2)."""
    COMMIT_QUORUM_OFF_BY_ONE = 2
    """Count ``len(voters) // 2`` replicas as a quorum (one too few)."""
    REPAIR_OFF = 3
    """Start as a normal member although storage lost durable data (no repair mode)."""


@dataclass(frozen=True, slots=True)
class RaftOptions:
    server_id: ServerId
    rng: RandomSource
    limits: Limits = DEFAULT_LIMITS
    pre_vote: bool = True
    check_quorum: bool = True
    fault: Fault = Fault.NONE


@dataclass(slots=True)
class _Incoming:
    """A snapshot a follower is receiving: the checkpoint's bytes, then (once decoded)
    the live entries it lacks."""

    index: int
    term: int
    data: bytearray
    snapshot: Snapshot | None = None
    missing: BitMap64 | None = None
    entries: list[Entry] = field(default_factory=list)

    def next_offset(self) -> int:
        return len(self.data) + len(self.entries)


def _expected(inc: _Incoming, entries: list[Entry]) -> bool:
    """``entries`` are the next ones of the missing set, in order."""
    assert inc.missing is not None
    k = len(inc.entries)
    return [e.index for e in entries] == list(inc.missing[k : k + len(entries)])


@dataclass(slots=True)
class _CatchUp:
    request_id: int
    server: ServerId
    round_target: int
    round_start_ms: int
    rounds: int
    learner_index: int


class RaftServer:
    """One member of one Raft group. Create it from what storage recovered.

    ``snapshot`` says where storage's log starts; ``checkpoint`` (at or after it, default
    the snapshot) is where the machine was restored: replay starts after it and only the
    log after it is read for configuration changes. Neither carries a payload, so
    creating a server reads no live entry whatever the depth of the queue."""

    def __init__(
        self,
        options: RaftOptions,
        store: LogStore,
        hard_state: HardState | None = None,
        snapshot: SnapshotMeta | None = None,
        bootstrap: Configuration = EMPTY_CONFIGURATION,
        now_ms: int = 0,
        checkpoint: SnapshotMeta | None = None,
        repair: bool = False,
    ) -> None:
        self.id = options.server_id
        self.options = options
        self.limits = options.limits
        self.rng = options.rng
        hs = hard_state or HardState(0, None, 0)
        snap_index = snapshot.index if snapshot else 0
        snap_term = snapshot.term if snapshot else 0
        assert store.snapshot_index() == snap_index, "storage and snapshot agree"
        self.log = RaftLog(store, snap_index, snap_term)
        base = checkpoint if checkpoint is not None else snapshot
        base_index = base.index if base else 0
        assert snap_index <= base_index <= self.log.last_index(), "checkpoint in the log"
        assert base is None or self.log.term(base_index) == base.term, "checkpoint matches"
        self.term = hs.term
        self.vote: ServerId | None = hs.vote
        self.commit = max(base_index, min(hs.commit, self.log.last_index()))
        repair = repair and options.fault is not Fault.REPAIR_OFF
        self.repairing = repair
        """Storage lost durable state of this server: see the module's rules."""
        if repair:
            # Only the checkpoint is known to hold committed entries: what the log holds
            # after it may be an older version of entries rewritten before the damage.
            self.commit = base_index
        self.applied = base_index
        self.role = Role.FOLLOWER
        self.leader: ServerId | None = None
        self.now_ms = now_ms
        self.snapshot: Snapshot | None = None
        """The snapshot a leader ships; handed in by ``SnapshotTaken`` (or installed)."""
        self.configs: list[tuple[int, Configuration]] = [
            (base_index, base.config if base else bootstrap)
        ]
        self._scan_configs(base_index + 1)
        if repair and self.config.voters == (self.id,):
            raise RecoveryRefused(
                f"{self.id}: durable data was lost and the group has no other member to "
                "repair it from; restore it from a backup"
            )
        self.progress: dict[ServerId, Progress] = {}
        self.votes: dict[ServerId, bool] = {}
        self.election_deadline_ms = 0
        self.leader_contact_ms = -(1 << 40)
        self.heartbeat_due_ms = 0
        self.check_quorum_due_ms = 0
        self.term_start_index = 0
        self.uncommitted: deque[tuple[int, int]] = deque()
        self.uncommitted_bytes = 0
        self.read_seq = 0
        self.pending_reads: deque[tuple[int, int, int]] = deque()
        """(read seq, request id, read index), waiting for a quorum to confirm the seq."""
        self.confirmed_reads: deque[tuple[int, int]] = deque()
        self.reads_waiting_term_commit: list[int] = []
        self.catch_up: _CatchUp | None = None
        self.change_request: tuple[int, int] | None = None
        """(request id, config entry index) of a removal waiting to commit."""
        self.transfer: tuple[int, ServerId, int] | None = None
        """(request id, target, deadline ms) of a leadership transfer in progress."""
        self.transfer_sent = False
        self.incoming_snapshot: _Incoming | None = None
        self.pending_install: tuple[Snapshot, list[Entry]] | None = None
        self.hard_state_out = HardState(self.term, self.vote, self.commit)
        self.rd = Ready()
        if repair:
            self.term, self.vote = self.term + 1, None
        self._reset_election_timer()

    # --- public surface --------------------------------------------------------------

    @property
    def config(self) -> Configuration:
        return self.configs[-1][1]

    def config_at(self, index: int) -> Configuration:
        """The configuration in force at ``index`` (at or after the snapshot)."""
        assert index >= self.configs[0][0]
        found = self.configs[0][1]
        for at, config in self.configs:
            if at > index:
                break
            found = config
        return found

    def handle(self, event: Event) -> Ready:
        self.step(event)
        return self.ready()

    def step(self, event: Event) -> None:
        if type(event) is Receive:
            self._on_message(event.message)
        elif type(event) is Tick:
            self._on_tick(event.now_ms)
        elif type(event) is Propose:
            self._on_propose(event)
        elif type(event) is Persisted:
            self._on_persisted(event.index, event.term)
        elif type(event) is ReadIndex:
            self._on_read_index(event.request_id)
        elif type(event) is AddServer:
            self._on_add_server(event)
        elif type(event) is RemoveServer:
            self._on_remove_server(event)
        elif type(event) is TransferLeadership:
            self._on_transfer(event)
        elif type(event) is SnapshotTaken:
            self._on_snapshot_taken(event.snapshot)
        elif type(event) is SnapshotInstalled:
            self._on_snapshot_installed(event.index, event.term)
        else:
            raise AssertionError(f"unknown event {event!r}")
        if self.repairing:
            self._maybe_finish_repair()

    def ready(self) -> Ready:
        rd = self.rd
        self.rd = Ready()
        hs = HardState(self.term, self.vote, self.commit)
        if hs != self.hard_state_out:
            rd.hard_state = self.hard_state_out = hs
        if self.pending_install is not None:
            rd.snapshot_to_install, rd.snapshot_entries = self.pending_install
            self.pending_install = None
        rd.entries_to_persist = self.log.take_unpersisted()
        self._collect_committed(rd)
        while self.confirmed_reads and self.confirmed_reads[0][1] <= self.applied:
            request_id, index = self.confirmed_reads.popleft()
            rd.reads.append(ReadReady(request_id, index))
        return rd

    # --- repair ----------------------------------------------------------------------

    def _maybe_finish_repair(self) -> None:
        """Leave repair once a committed entry of the leader's term is durable here (see
        the module's rules), voting for that leader in its term."""
        leader = self.leader
        if leader is None or leader == self.id or self.role is not Role.FOLLOWER:
            return
        c = self.commit
        if c == 0 or c > self.log.stable_last or self.log.term(c) != self.term:
            return
        assert self.vote in (None, leader), "a repairing server grants no vote"
        self.repairing = False
        self.vote = leader
        self.rd.repaired = True

    # --- time ------------------------------------------------------------------------

    def _on_tick(self, now_ms: int) -> None:
        if now_ms <= self.now_ms:
            return
        self.now_ms = now_ms
        if self.role is Role.LEADER:
            self._tick_leader()
        elif now_ms >= self.election_deadline_ms:
            if self._is_voter(self.id) and not self.repairing:
                self._campaign(transfer=False)
            else:
                self._reset_election_timer()

    def _tick_leader(self) -> None:
        now = self.now_ms
        if self.options.check_quorum and now >= self.check_quorum_due_ms:
            self.check_quorum_due_ms = now + self.limits.election_timeout_ms_min
            if not self._quorum_active():
                self._become_follower(self.term, None)
                return
            self.leader_contact_ms = now
        if self.transfer is not None and now >= self.transfer[2]:
            self.rd.rejected.append(Rejected(self.transfer[0], "timeout", self.id))
            self.transfer = None
        if now >= self.heartbeat_due_ms:
            self.heartbeat_due_ms = now + self.limits.heartbeat_interval_ms
            self._broadcast_heartbeat()
            self._unstick_followers()

    def _quorum_active(self) -> bool:
        active = 1 if self._is_voter(self.id) else 0
        for peer, pr in self.progress.items():
            if pr.recent_active and self._is_voter(peer):
                active += 1
            pr.recent_active = False
        return active >= self.config.quorum()

    def _unstick_followers(self) -> None:
        """Resend what was lost: a probe that got no answer, a silent pipeline, a chunk."""
        last = self.log.last_index()
        stall_ms = 2 * self.limits.heartbeat_interval_ms
        for peer, pr in self.progress.items():
            if pr.state is ProgressState.PROBE:
                pr.probe_sent = False
                self._maybe_send_append(peer, pr, allow_empty=False)
            elif pr.state is ProgressState.REPLICATE:
                if pr.match < last and self.now_ms - pr.last_progress_ms >= stall_ms:
                    pr.become_probe(pr.match + 1)
                    self._maybe_send_append(peer, pr, allow_empty=True)
            elif self.now_ms - pr.snapshot_sent_ms >= stall_ms:
                self._send_snapshot_chunk(peer, pr)

    def _reset_election_timer(self) -> None:
        lo, hi = self.limits.election_timeout_ms_min, self.limits.election_timeout_ms_max
        self.election_deadline_ms = self.now_ms + self.rng.randint(lo, hi - 1)

    # --- role changes ----------------------------------------------------------------

    def _become_follower(self, term: int, leader: ServerId | None) -> None:
        was_leader = self.role is Role.LEADER
        if term > self.term:
            self.term, self.vote = term, None
        self.role = Role.FOLLOWER
        self.leader = leader
        self.progress = {}
        self._reset_election_timer()
        if was_leader:
            self._drop_leader_state()

    def _drop_leader_state(self) -> None:
        for _seq, request_id, _index in self.pending_reads:
            self.rd.rejected.append(Rejected(request_id, "lost_leadership", self.leader))
        for request_id, _index in self.confirmed_reads:
            self.rd.rejected.append(Rejected(request_id, "lost_leadership", self.leader))
        for request_id in self.reads_waiting_term_commit:
            self.rd.rejected.append(Rejected(request_id, "lost_leadership", self.leader))
        self.pending_reads.clear()
        self.confirmed_reads.clear()
        self.reads_waiting_term_commit = []
        if self.catch_up is not None:
            self.rd.rejected.append(Rejected(self.catch_up.request_id, "lost_leadership", None))
            self.catch_up = None
        if self.change_request is not None:
            self.rd.rejected.append(Rejected(self.change_request[0], "lost_leadership", None))
            self.change_request = None
        if self.transfer is not None:
            self.rd.completed.append(Completed(self.transfer[0], 0))
            self.transfer = None
        self.uncommitted.clear()
        self.uncommitted_bytes = 0

    def _campaign(self, transfer: bool) -> None:
        pre = self.options.pre_vote and not transfer
        self.role = Role.PRE_CANDIDATE if pre else Role.CANDIDATE
        self.leader = None
        if not pre:
            self.term += 1
            self.vote = self.id
        self._reset_election_timer()
        self.votes = {self.id: True}
        if self._won(self.votes):
            self._on_election_won(pre)
            return
        term = self.term + 1 if pre else self.term
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in self.config.voters:
            if voter != self.id:
                req = VoteRequest(self.id, voter, term, last_index, last_term, pre, transfer)
                self.rd.messages_after_persist.append(req)

    def _won(self, votes: dict[ServerId, bool]) -> bool:
        granted = sum(1 for v, ok in votes.items() if ok and self._is_voter(v))
        return granted >= self.config.quorum()

    def _lost(self, votes: dict[ServerId, bool]) -> bool:
        refused = sum(1 for v, ok in votes.items() if not ok and self._is_voter(v))
        return refused > len(self.config.voters) - self.config.quorum()

    def _on_election_won(self, pre: bool) -> None:
        if pre:
            self._campaign_after_pre_vote()
        else:
            self._become_leader()

    def _campaign_after_pre_vote(self) -> None:
        self.role = Role.CANDIDATE
        self.term += 1
        self.vote = self.id
        self.votes = {self.id: True}
        if self._won(self.votes):
            self._become_leader()
            return
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for voter in self.config.voters:
            if voter != self.id:
                req = VoteRequest(self.id, voter, self.term, last_index, last_term, False, False)
                self.rd.messages_after_persist.append(req)

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        last = self.log.last_index()
        self.progress = {
            peer: Progress(last + 1, self.now_ms) for peer in self.config.members if peer != self.id
        }
        self.heartbeat_due_ms = self.now_ms
        self.check_quorum_due_ms = self.now_ms + self.limits.election_timeout_ms_min
        self._append_as_leader([(EntryKind.NOOP, b"")])
        self.term_start_index = last + 1
        self._broadcast_append()

    # --- proposals -------------------------------------------------------------------

    def _on_propose(self, event: Propose) -> None:
        reason = self._refuse_proposal_reason()
        size = sum(len(c) for c in event.commands)
        if reason is None and not event.commands:
            reason = "bad_request"
        elif reason is None and self.uncommitted_bytes + size > self.limits.uncommitted_bytes_max:
            reason = "backpressure"
        if reason is not None:
            self.rd.rejected.append(Rejected(event.request_id, reason, self.leader))
            return
        first = self.log.last_index() + 1
        last = self._append_commands(event.commands)
        self.uncommitted.append((last, size))
        self.uncommitted_bytes += size
        self.rd.accepted.append(Accepted(event.request_id, first, last, self.term))
        self._broadcast_append()

    def _refuse_proposal_reason(self) -> str | None:
        if self.role is not Role.LEADER:
            return "not_leader"
        if self.transfer is not None:
            return "transferring"
        return None

    def _append_commands(self, commands: tuple[bytes, ...]) -> int:
        index, term, now = self.log.last_index(), self.term, self.now_ms
        command = EntryKind.COMMAND
        entries = []
        for data in commands:
            index += 1
            entries.append(Entry(index, term, command, now, data))
        self.log.append(entries)
        return index

    def _append_as_leader(self, items: list[tuple[EntryKind, bytes]]) -> int:
        index = self.log.last_index()
        entries = []
        for kind, data in items:
            index += 1
            entries.append(Entry(index, self.term, kind, self.now_ms, data))
            if kind is EntryKind.CONFIG:
                self.configs.append((index, Configuration.decode(data)))
        self.log.append(entries)
        return index

    # --- membership and transfer ------------------------------------------------------

    def _change_refusal(self) -> str | None:
        reason = self._refuse_proposal_reason()
        if reason is not None:
            return reason
        if self.commit < self.term_start_index or self.configs[-1][0] > self.commit:
            return "change_pending"
        if self.catch_up is not None or self.change_request is not None:
            return "change_pending"
        return None

    def _on_add_server(self, event: AddServer) -> None:
        reason = self._change_refusal()
        if reason is None and event.server in self.config.members:
            reason = "bad_request"
        if reason is not None:
            self.rd.rejected.append(Rejected(event.request_id, reason, self.leader))
            return
        config = self.config.with_learner(event.server)
        index = self._append_as_leader([(EntryKind.CONFIG, config.encode())])
        self.progress[event.server] = Progress(index, self.now_ms)
        self.catch_up = _CatchUp(event.request_id, event.server, index, self.now_ms, 1, index)
        self._broadcast_append()

    def _on_remove_server(self, event: RemoveServer) -> None:
        reason = self._change_refusal()
        if reason is None and event.server not in self.config.members:
            reason = "bad_request"
        if reason is None and len(self.config.voters) == 1 and event.server in self.config.voters:
            reason = "bad_request"
        if reason is not None:
            self.rd.rejected.append(Rejected(event.request_id, reason, self.leader))
            return
        config = self.config.without(event.server)
        index = self._append_as_leader([(EntryKind.CONFIG, config.encode())])
        self.progress.pop(event.server, None)
        self.change_request = (event.request_id, index)
        self._maybe_commit()
        self._broadcast_append()

    def _maybe_promote(self, peer: ServerId, pr: Progress) -> None:
        cu = self.catch_up
        if cu is None or cu.server != peer or pr.match < cu.round_target:
            return
        if self.commit < cu.learner_index:
            return
        in_time = self.now_ms - cu.round_start_ms <= self.limits.election_timeout_ms_min
        if in_time or pr.match >= self.log.last_index():
            config = self.config.with_voter(peer)
            index = self._append_as_leader([(EntryKind.CONFIG, config.encode())])
            self.change_request = (cu.request_id, index)
            self.catch_up = None
            self._broadcast_append()
            return
        if cu.rounds >= self.limits.catch_up_rounds_max:
            self.rd.rejected.append(Rejected(cu.request_id, "not_caught_up", self.id))
            self.catch_up = None
            return
        cu.rounds += 1
        cu.round_target = self.log.last_index()
        cu.round_start_ms = self.now_ms

    def _on_transfer(self, event: TransferLeadership) -> None:
        reason = self._refuse_proposal_reason()
        if reason is None and (event.target == self.id or not self._is_voter(event.target)):
            reason = "bad_request"
        if reason is not None:
            self.rd.rejected.append(Rejected(event.request_id, reason, self.leader))
            return
        deadline = self.now_ms + self.limits.election_timeout_ms_min
        self.transfer = (event.request_id, event.target, deadline)
        self.transfer_sent = False
        pr = self.progress[event.target]
        if pr.match == self.log.last_index():
            self._send_timeout_now(event.target)
        else:
            self._maybe_send_append(event.target, pr, allow_empty=False)

    def _send_timeout_now(self, target: ServerId) -> None:
        assert self.transfer is not None
        if not self.transfer_sent:
            self.transfer_sent = True
            self.rd.messages.append(TimeoutNow(self.id, target, self.term))

    # --- replication (leader) -----------------------------------------------------------

    def _broadcast_append(self) -> None:
        for peer, pr in self.progress.items():
            self._maybe_send_append(peer, pr, allow_empty=False)
        if not self.progress:
            self._maybe_commit()

    def _broadcast_heartbeat(self) -> None:
        for peer, pr in self.progress.items():
            commit = min(self.commit, pr.match)
            self.rd.messages.append(Heartbeat(self.id, peer, self.term, commit, self.read_seq))

    def _maybe_send_append(self, peer: ServerId, pr: Progress, allow_empty: bool) -> bool:
        limits = self.limits
        if pr.is_paused(
            limits.inflight_messages_per_follower_max, limits.inflight_bytes_per_follower_max
        ):
            return False
        log = self.log
        last = log.last_index()
        if pr.next > last and not allow_empty and pr.state is ProgressState.REPLICATE:
            return False
        prev = pr.next - 1
        prev_term = log.term(prev)
        if prev_term is None:
            return self._begin_snapshot(peer, pr)
        try:
            entries = log.entries(
                pr.next,
                last + 1,
                limits.append_bytes_per_message_max,
                limits.append_entries_per_message_max,
            )
        except LookupError:
            return self._begin_snapshot(peer, pr)
        size = 0
        for e in entries:
            size += len(e.data)
        msg = AppendRequest(self.id, peer, self.term, prev, prev_term, entries, self.commit)
        self.rd.messages.append(msg)
        pr.sent(prev + len(entries), size)
        return True

    def _on_append_response(self, msg: AppendResponse) -> None:
        pr = self.progress.get(msg.src)
        if pr is None:
            return
        pr.recent_active = True
        if not msg.success:
            self._on_append_rejected(msg, pr)
            return
        updated = pr.maybe_update(msg.match_index, self.now_ms)
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        if updated:
            if self._is_voter(msg.src):
                self._maybe_commit()
            self._maybe_promote(msg.src, pr)
        transfer = self.transfer
        if transfer is not None and transfer[1] == msg.src and pr.match == self.log.last_index():
            self._send_timeout_now(msg.src)
        while self._maybe_send_append(msg.src, pr, allow_empty=False):
            if pr.next > self.log.last_index():
                break

    def _on_append_rejected(self, msg: AppendResponse, pr: Progress) -> None:
        if msg.rejected_prev_index < pr.match:
            return
        if pr.state is ProgressState.SNAPSHOT:
            return
        next_index = msg.conflict_index
        if msg.conflict_term > 0:
            found = self._last_index_of_term(msg.conflict_term, msg.rejected_prev_index)
            if found:
                next_index = found + 1
        next_index = min(next_index, msg.rejected_prev_index)
        pr.become_probe(max(next_index, 1))
        self._maybe_send_append(msg.src, pr, allow_empty=True)

    def _last_index_of_term(self, term: int, upto: int) -> int:
        index = min(upto, self.log.last_index())
        while index > self.log.snapshot_index:
            t = self.log.term(index)
            if t is None or t < term:
                return 0
            if t == term:
                return index
            index -= 1
        return 0

    def _maybe_commit(self) -> None:
        voters = self.config.voters
        matches = []
        for v in voters:
            if v == self.id:
                matches.append(self.log.stable_last)
            else:
                pr = self.progress.get(v)
                matches.append(pr.match if pr is not None else 0)
        if not matches:
            return
        matches.sort(reverse=True)
        quorum = len(voters) // 2 + 1
        if self.options.fault is Fault.COMMIT_QUORUM_OFF_BY_ONE:
            quorum = max(1, len(voters) // 2)
        candidate = matches[quorum - 1]
        if candidate <= self.commit:
            return
        if (
            self.log.term(candidate) != self.term
            and self.options.fault is not Fault.COMMIT_ANY_TERM
        ):
            return
        self._commit_to(candidate)

    def _commit_to(self, index: int) -> None:
        self.commit = index
        while self.uncommitted and self.uncommitted[0][0] <= index:
            self.uncommitted_bytes -= self.uncommitted.popleft()[1]
        cu = self.catch_up
        if cu is not None and cu.learner_index <= index:
            # The learner may have caught up before its entry committed; look again.
            self._maybe_promote(cu.server, self.progress[cu.server])
        if self.change_request is not None and self.change_request[1] <= index:
            self.rd.completed.append(Completed(*self.change_request))
            self.change_request = None
        if self.reads_waiting_term_commit and index >= self.term_start_index:
            waiting, self.reads_waiting_term_commit = self.reads_waiting_term_commit, []
            for request_id in waiting:
                self._on_read_index(request_id)
        removed = self.role is Role.LEADER and not self._is_voter(self.id)
        if removed and self.configs[-1][0] <= index:
            # A leader that removed itself leads until the change commits (thesis 4.2.2).
            self._become_follower(self.term, None)

    # --- snapshots (leader side) --------------------------------------------------------

    def _begin_snapshot(self, peer: ServerId, pr: Progress) -> bool:
        snap = self.snapshot
        if snap is None or snap.index < self.log.snapshot_index:
            return False  # the runtime hands the current one in with SnapshotTaken
        pr.become_snapshot(snap.index, snap.term, snap.encode(), self.now_ms)
        self._send_snapshot_chunk(peer, pr)
        return True

    def _send_snapshot_chunk(self, peer: ServerId, pr: Progress) -> None:
        """The checkpoint's bytes from the offset the follower wants, or past them the
        next live entries it lacks (read from storage now, bounded per message)."""
        size = self.limits.snapshot_chunk_bytes
        whole = pr.snapshot_data
        start = pr.snapshot_offset
        entries: list[Entry] = []
        if start >= len(whole) and pr.snapshot_missing is None:
            start = (len(whole) - 1) // size * size  # ask again for the missing set
        if start < len(whole):
            data = whole[start : start + size]
            done = start + len(data) >= len(whole)
        else:
            assert pr.snapshot_missing is not None
            data = b""
            entries = self._missing_entries(pr.snapshot_missing, start - len(whole))
            if not entries:
                # A live entry is gone: a newer snapshot replaced this one; start over.
                pr.become_probe(pr.match + 1)
                return
            done = start - len(whole) + len(entries) >= len(pr.snapshot_missing)
        chunk = SnapshotChunk(
            self.id,
            peer,
            self.term,
            pr.snapshot_index,
            pr.snapshot_term,
            start,
            data,
            done,
            entries,
        )
        pr.snapshot_sent_ms = self.now_ms
        self.rd.messages.append(chunk)

    def _missing_entries(self, missing: BitMap64, skip: int) -> list[Entry]:
        """The live entries ``missing[skip:]`` within one message's bounds; empty if one
        of them is no longer stored."""
        limits = self.limits
        out: list[Entry] = []
        size = 0
        for index in missing[skip : skip + limits.append_entries_per_message_max]:
            try:
                entry = self.log.store.entry(index)
            except LookupError:
                return []
            assert entry.index == index
            size += len(entry.data)
            if out and size > limits.append_bytes_per_message_max:
                break
            out.append(entry)
        return out

    def _on_snapshot_response(self, msg: SnapshotResponse) -> None:
        pr = self.progress.get(msg.src)
        if pr is None:
            return
        pr.recent_active = True
        if pr.state is not ProgressState.SNAPSHOT or msg.snapshot_index != pr.snapshot_index:
            return
        if msg.next_offset < 0:
            pr.maybe_update(pr.snapshot_index, self.now_ms)
            pr.become_probe(pr.snapshot_index + 1)
            self._maybe_send_append(msg.src, pr, allow_empty=True)
            return
        if msg.missing:
            # The follower's latest word (it may have restarted and lost some entries).
            pr.snapshot_missing = BitMap64.deserialize(msg.missing)
        if msg.next_offset > len(pr.snapshot_data) and pr.snapshot_missing is None:
            return  # the stall timer asks again with a piece of the checkpoint
        pr.snapshot_offset = msg.next_offset
        self._send_snapshot_chunk(msg.src, pr)

    def _on_snapshot_taken(self, snapshot: Snapshot) -> None:
        assert snapshot.index <= self.applied, "a snapshot covers applied entries only"
        if self.snapshot is not None and snapshot.index <= self.snapshot.index:
            return
        self.snapshot = snapshot
        self.log.compacted(snapshot.index, snapshot.term)
        if snapshot.index > self.configs[0][0]:
            base = self.config_at(snapshot.index)
            self.configs = [(snapshot.index, base)] + [
                (i, c) for i, c in self.configs if i > snapshot.index
            ]

    # --- messages --------------------------------------------------------------------

    def _on_message(self, msg: Message) -> None:
        if msg.term > self.term and not self._on_higher_term(msg):
            return
        if msg.term < self.term:
            self._on_lower_term(msg)
            return
        kind = type(msg)
        if kind is AppendRequest:
            self._on_append_request(msg)  # type: ignore[arg-type]
        elif kind is AppendResponse:
            if self.role is Role.LEADER:
                self._on_append_response(msg)  # type: ignore[arg-type]
        elif kind is Heartbeat:
            self._on_heartbeat(msg)  # type: ignore[arg-type]
        elif kind is HeartbeatResponse:
            if self.role is Role.LEADER:
                self._on_heartbeat_response(msg)  # type: ignore[arg-type]
        elif kind is VoteRequest:
            self._on_vote_request(msg)  # type: ignore[arg-type]
        elif kind is VoteResponse:
            self._on_vote_response(msg)  # type: ignore[arg-type]
        elif kind is SnapshotChunk:
            self._on_snapshot_chunk(msg)  # type: ignore[arg-type]
        elif kind is SnapshotResponse:
            if self.role is Role.LEADER:
                self._on_snapshot_response(msg)  # type: ignore[arg-type]
        elif kind is TimeoutNow and self._is_voter(self.id) and not self.repairing:
            self._campaign(transfer=True)

    def _on_higher_term(self, msg: Message) -> bool:
        """Says whether ``msg`` is processed further after seeing its higher term."""
        if type(msg) is VoteRequest:
            in_lease = (
                self.options.check_quorum
                and self.leader is not None
                and self.now_ms - self.leader_contact_ms < self.limits.election_timeout_ms_min
            )
            if in_lease and not msg.transfer:
                if msg.pre:
                    self._reply_vote(msg, False)
                return False
            if msg.pre:
                return True
        elif type(msg) is VoteResponse and msg.pre and msg.granted:
            return True
        leader = msg.src if type(msg) in (AppendRequest, Heartbeat, SnapshotChunk) else None
        self._become_follower(msg.term, leader)
        return True

    def _on_lower_term(self, msg: Message) -> None:
        kind = type(msg)
        if kind in (AppendRequest, Heartbeat, SnapshotChunk):
            # Tell a stale leader (it may be cut off by check-quorum and pre-vote) the term.
            self.rd.messages_after_persist.append(
                AppendResponse(self.id, msg.src, self.term, False, 0, 0, 0, 0)
            )
        elif kind is VoteRequest and msg.pre:  # type: ignore[union-attr]
            self._reply_vote(msg, False)  # type: ignore[arg-type]

    def _reply_vote(self, msg: VoteRequest, granted: bool) -> None:
        term = msg.term if granted else self.term
        self.rd.messages_after_persist.append(
            VoteResponse(self.id, msg.src, term, granted, msg.pre)
        )

    def _on_vote_request(self, msg: VoteRequest) -> None:
        if self.repairing:
            self._reply_vote(msg, False)
            return
        log = self.log
        up_to_date = (msg.last_term, msg.last_index) >= (log.last_term(), log.last_index())
        if msg.pre:
            free = self.vote == msg.src or (self.vote is None and self.leader is None)
            self._reply_vote(msg, up_to_date and (msg.term > self.term or free))
            return
        can_vote = self.vote == msg.src or (self.vote is None and self.leader is None)
        granted = up_to_date and can_vote
        if granted:
            self.vote = msg.src
            self._reset_election_timer()
        self._reply_vote(msg, granted)

    def _on_vote_response(self, msg: VoteResponse) -> None:
        expected = Role.PRE_CANDIDATE if msg.pre else Role.CANDIDATE
        if self.role is not expected:
            return
        if msg.pre and msg.term != self.term + 1 and msg.granted:
            return
        self.votes[msg.src] = msg.granted
        if self._won(self.votes):
            self._on_election_won(msg.pre)
        elif self._lost(self.votes):
            self._become_follower(self.term, None)

    def _heard_from_leader(self, leader: ServerId) -> None:
        assert self.role is not Role.LEADER, f"two leaders in term {self.term}"
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader = leader
        self.leader_contact_ms = self.now_ms
        self._reset_election_timer()

    def _on_heartbeat(self, msg: Heartbeat) -> None:
        self._heard_from_leader(msg.src)
        if msg.commit > self.commit and not self.repairing:
            self.commit = min(msg.commit, self.log.last_index())
        resp = HeartbeatResponse(self.id, msg.src, self.term, msg.read_seq, self.repairing)
        self.rd.messages.append(resp)

    def _on_heartbeat_response(self, msg: HeartbeatResponse) -> None:
        pr = self.progress.get(msg.src)
        if pr is None:
            return
        pr.recent_active = True
        if msg.read_seq > pr.read_acked:
            pr.read_acked = msg.read_seq
            self._maybe_confirm_reads()
        if pr.match < self.log.last_index() and pr.state is ProgressState.PROBE:
            self._maybe_send_append(msg.src, pr, allow_empty=False)
        elif msg.repairing and pr.state is not ProgressState.SNAPSHOT:
            self._maybe_send_append(msg.src, pr, allow_empty=True)

    def _on_append_request(self, msg: AppendRequest) -> None:
        self._heard_from_leader(msg.src)
        log = self.log
        prev = msg.prev_index
        if prev < self.commit:
            self._accept_append_below_commit(msg)
            return
        if not log.matches(prev, msg.prev_term):
            self._reject_append(msg)
            return
        entries = msg.entries
        last_new = prev + len(entries)
        self._append_new_entries(entries)
        if msg.commit > self.commit:
            self.commit = min(msg.commit, last_new)
        self.rd.messages_after_persist.append(
            AppendResponse(self.id, msg.src, self.term, True, last_new, 0, 0, 0)
        )

    def _accept_append_below_commit(self, msg: AppendRequest) -> None:
        """Entries up to our commit index match the leader's (they are committed); keep
        only what follows it."""
        skip = self.commit - msg.prev_index
        entries = msg.entries[skip:]
        last_new = self.commit + len(entries)
        if entries:
            self._append_new_entries(entries)
        if msg.commit > self.commit:
            self.commit = min(msg.commit, last_new)
        self.rd.messages_after_persist.append(
            AppendResponse(self.id, msg.src, self.term, True, last_new, 0, 0, 0)
        )

    def _append_new_entries(self, entries: list[Entry]) -> None:
        log = self.log
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
        assert first > self.commit, "a committed entry is never overwritten"
        if first <= last:
            self.configs = [(i, c) for i, c in self.configs if i < first]
        log.append(fresh)
        for e in fresh:
            if e.kind is EntryKind.CONFIG:
                self.configs.append((e.index, Configuration.decode(e.data)))

    def _reject_append(self, msg: AppendRequest) -> None:
        log = self.log
        prev = msg.prev_index
        last = log.last_index()
        if prev > last:
            conflict_term, conflict_index = 0, last + 1
        else:
            conflict_term = log.term(prev) or 0
            conflict_index = prev
            while conflict_index - 1 > max(self.commit, log.snapshot_index) and (
                log.term(conflict_index - 1) == conflict_term
            ):
                conflict_index -= 1
        self.rd.messages_after_persist.append(
            AppendResponse(
                self.id, msg.src, self.term, False, 0, prev, conflict_term, conflict_index
            )
        )

    # --- snapshots (follower side) ------------------------------------------------------

    def _on_snapshot_chunk(self, msg: SnapshotChunk) -> None:
        self._heard_from_leader(msg.src)
        if msg.snapshot_index <= self.commit:
            self._reply_snapshot(msg, -1)
            return
        if self.log.matches(msg.snapshot_index, msg.snapshot_term):
            # Our log holds the snapshot's last entry: keep it and what follows (section 7).
            self.commit = msg.snapshot_index
            self.incoming_snapshot = None
            self._reply_snapshot(msg, -1)
            return
        key = (msg.snapshot_index, msg.snapshot_term)
        inc = self.incoming_snapshot
        known = inc is not None and (inc.index, inc.term) == key
        if msg.offset == 0 and not msg.entries and not (known and inc and inc.snapshot):
            inc = self.incoming_snapshot = _Incoming(*key, bytearray())
        if inc is None or (inc.index, inc.term) != key:
            self._reply_snapshot(msg, 0)
        elif inc.snapshot is None:
            self._on_checkpoint_piece(msg, inc)
        elif msg.entries and msg.offset == inc.next_offset() and _expected(inc, msg.entries):
            inc.entries.extend(msg.entries)
            self._maybe_install(msg, inc)
        else:
            # Out of order, or the leader works from another missing set (an answer from
            # before a restart of ours): say again what we lack.
            self._reply_snapshot(msg, inc.next_offset(), inc.missing)

    def _on_checkpoint_piece(self, msg: SnapshotChunk, inc: _Incoming) -> None:
        if msg.entries or len(inc.data) != msg.offset:
            self._reply_snapshot(msg, len(inc.data))
            return
        inc.data.extend(msg.data)
        if not msg.done:
            self._reply_snapshot(msg, len(inc.data))
            return
        snap = Snapshot.decode(bytes(inc.data))
        assert (snap.index, snap.term) == (inc.index, inc.term)
        inc.snapshot = snap
        inc.missing = snap.live_indexes - self._held_live(snap.live_indexes)
        self._maybe_install(msg, inc)

    def _held_live(self, live: BitMap64) -> BitMap64:
        """The indexes of ``live`` this server stores as committed entries after its own
        snapshot: they are the leader's (log matching), so they need not travel."""
        lo = self.log.snapshot_index
        hi = min(self.commit, self.log.stable_last)
        if hi <= lo:
            return BitMap64()
        held: BitMap64 = live[live.rank(lo) : live.rank(hi)]
        return held

    def _maybe_install(self, msg: SnapshotChunk, inc: _Incoming) -> None:
        assert inc.snapshot is not None and inc.missing is not None
        if len(inc.entries) < len(inc.missing):
            # The missing set answers a piece of the checkpoint only, not every message.
            self._reply_snapshot(msg, inc.next_offset(), None if msg.entries else inc.missing)
            return
        assert BitMap64(e.index for e in inc.entries) == inc.missing, "the entries asked for"
        self.incoming_snapshot = None
        self._install(inc.snapshot, inc.entries)
        self._reply_snapshot(msg, -1)

    def _install(self, snap: Snapshot, entries: list[Entry]) -> None:
        self.log.restore(snap.index, snap.term)
        self.log.stable_last = self.log.snapshot_index - 1
        self.commit = self.applied = snap.index
        self.snapshot = snap
        self.configs = [(snap.index, snap.config)]
        self.pending_install = (snap, entries)

    def _on_snapshot_installed(self, index: int, term: int) -> None:
        if index == self.log.snapshot_index and term == self.log.snapshot_term:
            self.log.stable_last = max(self.log.stable_last, index)

    def _reply_snapshot(
        self, msg: SnapshotChunk, next_offset: int, missing: BitMap64 | None = None
    ) -> None:
        """With ``missing``: tell the leader which live entries this server lacks."""
        data = b"" if missing is None else missing.serialize()
        resp = SnapshotResponse(self.id, msg.src, self.term, msg.snapshot_index, next_offset, data)
        self.rd.messages_after_persist.append(resp)

    # --- persistence, apply, reads -------------------------------------------------------

    def _on_persisted(self, index: int, term: int) -> None:
        if self.log.maybe_persisted(index, term) and self.role is Role.LEADER:
            self._maybe_commit()

    def _collect_committed(self, rd: Ready) -> None:
        hi = min(self.commit, self.log.stable_last)
        if hi <= self.applied:
            return
        limits = self.limits
        entries = self.log.entries(
            self.applied + 1,
            hi + 1,
            limits.committed_bytes_per_ready_max,
            limits.committed_entries_per_ready_max,
        )
        assert entries and entries[0].index == self.applied + 1
        rd.committed_entries = entries
        self.applied = entries[-1].index

    def _on_read_index(self, request_id: int) -> None:
        if self.role is not Role.LEADER:
            self.rd.rejected.append(Rejected(request_id, "not_leader", self.leader))
            return
        if self.commit < self.term_start_index:
            self.reads_waiting_term_commit.append(request_id)
            return
        self.read_seq += 1
        self.pending_reads.append((self.read_seq, request_id, self.commit))
        if len(self.config.voters) == 1 and self._is_voter(self.id):
            self._maybe_confirm_reads()
        else:
            self._broadcast_heartbeat()

    def _maybe_confirm_reads(self) -> None:
        if not self.pending_reads:
            return
        acked = sorted(
            (
                self.read_seq if v == self.id else self.progress[v].read_acked
                for v in self.config.voters
                if v == self.id or v in self.progress
            ),
            reverse=True,
        )
        quorum = self.config.quorum()
        if len(acked) < quorum:
            return
        confirmed_seq = acked[quorum - 1]
        while self.pending_reads and self.pending_reads[0][0] <= confirmed_seq:
            _seq, request_id, index = self.pending_reads.popleft()
            self.confirmed_reads.append((request_id, index))

    # --- helpers ---------------------------------------------------------------------

    def _is_voter(self, server: ServerId) -> bool:
        return server in self.config.voters

    def _scan_configs(self, lo: int) -> None:
        """The configurations in the log from ``lo`` (at start: all of it is in storage),
        found by kind, so that only their entries are read."""
        store = self.log.store
        for index in store.config_indexes(lo, self.log.last_index() + 1):
            self.configs.append((index, Configuration.decode(store.entry(index).data)))


__all__ = ["Fault", "RaftOptions", "RaftServer", "RandomSource", "Role"]
