"""The Raft server as a pure object: ``step(event)`` changes it, ``ready()`` says what to do.

The server holds one member's state and dispatches events; each concept has its module
(as etcd-raft's packages): ``election`` (votes, pre-vote), ``quorum`` (the one quorum
rule), ``read_only`` (ReadIndex), ``membership`` (changes, learner catch-up, leadership
transfer), ``snapshot_transfer`` (sending and receiving snapshots), ``progress`` (what
the leader knows of each follower), ``raft_log`` (the log with its unstable tail).

Rules kept here:

- No I/O, clock or randomness of its own: time comes from ``Tick``, chance from the
  ``RandomSource`` passed in, durability from ``Persisted``.
- Two clocks: timers run on ``Tick.now_ms`` (monotonic), entries are stamped with
  ``Tick.wall_ms``, never below the newest stamp this server appended or received, so
  the leader time the machine sees does not go backwards when a wall clock is stepped
  back or a leader with a slower wall clock takes over.
- A message that depends on unpersisted state goes out only after it is durable
  (``Ready.messages_after_persist``); the leader counts itself toward a quorum only up to
  what its own storage reported durable.
- Only entries of the current term are committed by counting replicas (Raft section 5.4.2).
- Check-quorum: a leader that did not hear from a quorum within the minimum election
  timeout steps down, and a voter that heard from a leader within it ignores campaigns
  (its leader lease), unless the campaign is a leadership transfer.
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
- ``check_invariants()`` states what holds between any two events; the simulator calls
  it after every step.
"""

from __future__ import annotations

from engine.errors import RecoveryRefused
from engine.ids import ServerId
from engine.raft import (
    election,
    invariants,
    membership,
    quorum,
    read_only,
    refusals,
    replication,
    snapshot_transfer,
)
from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.entry import Entry, EntryKind, LogStore
from engine.raft.events import (
    Accepted,
    AddServer,
    DemoteServer,
    Event,
    HardState,
    Persisted,
    Propose,
    ReadIndex,
    Ready,
    Receive,
    Rejected,
    RemoveServer,
    SnapshotInstalled,
    SnapshotTaken,
    Tick,
    TransferLeadership,
)
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
from engine.raft.options import Fault, RaftOptions, RandomSource
from engine.raft.progress import Progress
from engine.raft.raft_log import RaftLog
from engine.raft.read_only import ReadOnly
from engine.raft.role import Role
from engine.raft.snapshot import Snapshot, SnapshotMeta
from engine.shared_empty import EMPTY_DICT, EMPTY_LIST, check_shared_empties


class RaftServer:
    """One member of one Raft group. Create it from what storage recovered.

    ``snapshot`` says where storage's log starts; ``checkpoint`` (at or after it, default
    the snapshot) is where the machine was restored: replay starts after it and only the
    log after it is read for configuration changes. Neither carries a payload, so
    creating a server reads no live entry whatever the depth of the queue.

    The concept modules read and change its fields, and call the few methods without a
    leading underscore (``become_follower``, ``become_leader``, ``heard_from_leader``,
    ``reset_election_timer``, ``proposal_refusal``, ``append_as_leader``); nothing
    outside ``engine.raft`` changes it except through ``step``."""

    # Slots: a node hosts thousands of cores, and an instance dict costs ~1.5 KiB each.
    __slots__ = (
        "_rd",
        "append_due",
        "applied",
        "check_quorum_due_ms",
        "commit",
        "configs",
        "election_deadline_ms",
        "hard_state_out",
        "heartbeat_due_ms",
        "id",
        "incoming_snapshot",
        "leader",
        "leader_contact_ms",
        "limits",
        "log",
        "membership",
        "now_ms",
        "options",
        "pending_install",
        "progress",
        "reads",
        "refusal",
        "refused",
        "repairing",
        "rng",
        "role",
        "snapshot",
        "stamp_ms",
        "term",
        "term_start_index",
        "uncommitted",
        "uncommitted_bytes",
        "vote",
        "votes",
        "wall_ms",
    )

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
        wall_ms: int | None = None,
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
        """The monotonic clock of the last ``Tick``: every timer counts on it."""
        self.wall_ms = now_ms if wall_ms is None else wall_ms
        """The wall clock of the last ``Tick``: only stamped into entries."""
        self.stamp_ms = 0
        """The newest time stamped into an entry this server appended or received."""
        self.snapshot: Snapshot | None = None
        """The snapshot a leader ships; handed in by ``SnapshotTaken`` (or installed)."""
        self.configs: list[tuple[int, Configuration]] = [
            (base_index, base.config if base else bootstrap)
        ]
        """(index of the entry, configuration) from the checkpoint on, in index order."""
        self.configs += _configs_in(self.log, base_index + 1)
        if repair and self.config.voters == (self.id,):
            raise RecoveryRefused(
                f"{self.id}: durable data was lost and the group has no other member to "
                "repair it from; restore it from a backup"
            )
        self.progress: dict[ServerId, Progress] = {}
        """The leader's view of each other member; empty unless leading."""
        self.votes: dict[ServerId, bool] = EMPTY_DICT
        """Granted or refused, by voter, while campaigning (a new dict per campaign)."""
        self.election_deadline_ms = 0
        self.leader_contact_ms = -(1 << 40)
        self.heartbeat_due_ms = 0
        self.check_quorum_due_ms = 0
        self.term_start_index = 0
        """The index of the leader's first entry of its term (its no-op)."""
        self.uncommitted: list[tuple[int, int]] = EMPTY_LIST
        """(last index, bytes) of each accepted proposal not yet committed, oldest first
        (a list: an idle replica's empty deque would hold 760 bytes)."""
        self.uncommitted_bytes = 0
        self.reads = ReadOnly()
        self.membership = membership.Membership()
        self.incoming_snapshot: snapshot_transfer.Incoming | None = None
        self.pending_install: tuple[Snapshot, list[Entry]] | None = None
        self.hard_state_out = HardState(self.term, self.vote, self.commit)
        self.append_due = False
        """A leader appended proposals not sent yet: ``ready`` sends them, so that the
        proposals of one turn of the host's loop go to each follower as one append."""
        self._rd: Ready | None = None
        """What the next ``ready()`` returns, filled as events are stepped; made at the
        first use (``rd``): an empty ``Ready`` holds ten lists, 700 bytes an idle
        replica would keep."""
        self.refused = 0
        """Messages refused as impossible from a correct peer (``refusals``)."""
        self.refusal: str | None = None
        """Why the last of them was refused."""
        if repair:
            self.term, self.vote = self.term + 1, None
        self.reset_election_timer()

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
            self._on_tick(event.now_ms, event.wall_ms)
        elif type(event) is Propose:
            self._on_propose(event)
        elif type(event) is Persisted:
            if self.log.maybe_persisted(event.index, event.term) and self.role is Role.LEADER:
                replication.maybe_commit(self)
        elif type(event) is ReadIndex:
            read_only.on_read_index(self, event.request_id)
        elif type(event) is AddServer:
            membership.on_add_server(self, event)
        elif type(event) is RemoveServer:
            membership.on_remove_server(self, event)
        elif type(event) is DemoteServer:
            membership.on_demote_server(self, event)
        elif type(event) is TransferLeadership:
            membership.on_transfer(self, event)
        elif type(event) is SnapshotTaken:
            self._on_snapshot_taken(event.snapshot)
        elif type(event) is SnapshotInstalled:
            snapshot_transfer.on_installed(self, event.index, event.term)
        else:
            raise AssertionError(f"unknown event {event!r}")
        if self.repairing:
            self._maybe_finish_repair()

    def has_ready(self) -> bool:
        """Whether ``ready`` would hand out anything: answered without building a
        ``Ready`` (most calls find nothing to do)."""
        rd = self._rd
        if (rd is not None and not rd.is_empty()) or self.pending_install is not None:
            return True
        if self.append_due:
            return True
        hs = self.hard_state_out
        if (hs.term, hs.vote, hs.commit) != (self.term, self.vote, self.commit):
            return True
        log = self.log
        if log.handed_out <= log.last_index():
            return True
        if min(self.commit, log.stable_last) > self.applied:
            return True
        confirmed = self.reads.confirmed
        return bool(confirmed) and confirmed[0][1] <= self.applied

    @property
    def rd(self) -> Ready:
        """The ``Ready`` being filled (made now if none is)."""
        rd = self._rd
        if rd is None:
            rd = self._rd = Ready()
        return rd

    def ready(self) -> Ready:
        if self.append_due:
            self.append_due = False
            if self.role is Role.LEADER:
                replication.broadcast_append(self)
        rd = self._rd if self._rd is not None else Ready()
        self._rd = None
        out = self.hard_state_out
        # Compared field by field, as ``has_ready`` does: most calls find it unchanged,
        # and a ``HardState`` made and compared (its ``__eq__``) only to be thrown away
        # was two calls more on every Ready.
        if (out.term, out.vote, out.commit) != (self.term, self.vote, self.commit):
            rd.hard_state = self.hard_state_out = HardState(self.term, self.vote, self.commit)
        if self.pending_install is not None:
            rd.snapshot_to_install, rd.snapshot_entries = self.pending_install
            self.pending_install = None
        rd.entries_to_persist = self.log.take_unpersisted()
        self._collect_committed(rd)
        rd.reads = self.reads.take_ready(self.applied)
        return rd

    def next_deadline_ms(self) -> int | None:
        """When a ``Tick`` next has work to do: the election timeout of a non-leader; a
        leader's next heartbeat, check-quorum or transfer deadline. ``None``: a leader
        without other members has no timer."""
        if self.role is not Role.LEADER:
            return self.election_deadline_ms
        if not self.progress:
            return None
        due = min(self.heartbeat_due_ms, self.check_quorum_due_ms)
        transfer = self.membership.transfer
        return due if transfer is None else min(due, transfer.deadline_ms)

    def resume_as_sole_leader(self) -> bool:
        """Lead again in the durable term without an election, if this server, just made
        from storage, may (``election.resume_as_sole_leader``): whether it does."""
        return election.resume_as_sole_leader(self)

    def forget_uncommitted(self) -> None:
        """Every accepted proposal committed: back to the shared empty list."""
        assert not self.uncommitted and not self.uncommitted_bytes
        self.uncommitted = EMPTY_LIST

    def check_invariants(self) -> None:
        """Assert what holds between any two events (the simulator calls it after every
        step); an ``AssertionError`` names the broken rule (``engine.raft.invariants``)."""
        check_shared_empties()
        invariants.check(self)

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

    def _on_tick(self, now_ms: int, wall_ms: int | None) -> None:
        self.wall_ms = now_ms if wall_ms is None else wall_ms
        if now_ms <= self.now_ms:
            return
        self.now_ms = now_ms
        if self.role is Role.LEADER:
            self._tick_leader()
        elif now_ms >= self.election_deadline_ms:
            if self.id in self.config.voters and not self.repairing:
                election.campaign(self, transfer=False)
            else:
                self.reset_election_timer()

    def _tick_leader(self) -> None:
        now = self.now_ms
        if self.options.check_quorum and now >= self.check_quorum_due_ms:
            self.check_quorum_due_ms = now + self.limits.election_timeout_ms_min
            active = {self.id, *(p for p, pr in self.progress.items() if pr.recent_active)}
            for pr in self.progress.values():
                pr.recent_active = False
            if not quorum.has_quorum(self.config.voters, active.__contains__):
                self.become_follower(self.term, None)
                return
            self.leader_contact_ms = now
        membership.maybe_time_out_transfer(self)
        if now >= self.heartbeat_due_ms:
            self.heartbeat_due_ms = now + self.limits.heartbeat_interval_ms
            replication.broadcast_heartbeat(self, periodic=True)
            replication.unstick_followers(self)

    def reset_election_timer(self) -> None:
        lo, hi = self.limits.election_timeout_ms_min, self.limits.election_timeout_ms_max
        self.election_deadline_ms = self.now_ms + self.rng.randint(lo, hi - 1)

    # --- role changes ----------------------------------------------------------------

    def become_follower(self, term: int, leader: ServerId | None) -> None:
        was_leader = self.role is Role.LEADER
        if term > self.term:
            self.term, self.vote = term, None
        self.role = Role.FOLLOWER
        self.leader = leader
        self.votes = EMPTY_DICT
        self.progress = {}
        self.reset_election_timer()
        if was_leader:
            for request_id in self.reads.drop():
                self.rd.rejected.append(Rejected(request_id, "lost_leadership", self.leader))
            self.membership.drop(self.rd.rejected, self.rd.completed)
            self.uncommitted = EMPTY_LIST
            self.uncommitted_bytes = 0

    def become_leader(self) -> None:
        last = self.log.last_index()
        self.start_leading()
        self.append_as_leader([(EntryKind.NOOP, b"")])
        self.term_start_index = last + 1
        replication.broadcast_append(self)

    def start_leading(self) -> None:
        """Leader of the current term from now: votes dropped, every follower's progress
        from the end of the log, heartbeat due. The term's first index is the caller's
        (an election's no-op entry, or ``election.resume_as_sole_leader``'s last entry)."""
        self.role = Role.LEADER
        self.leader = self.id
        self.votes = EMPTY_DICT
        last = self.log.last_index()
        self.progress = {
            peer: Progress(last + 1, self.now_ms) for peer in self.config.members if peer != self.id
        }
        self.heartbeat_due_ms = self.now_ms
        self.check_quorum_due_ms = self.now_ms + self.limits.election_timeout_ms_min

    # --- proposals -------------------------------------------------------------------

    def _on_propose(self, event: Propose) -> None:
        reason = self.proposal_refusal()
        size = sum(map(len, event.commands))
        if reason is None and not event.commands:
            reason = "bad_request"
        elif reason is None and self.uncommitted_bytes + size > self.limits.uncommitted_bytes_max:
            reason = "backpressure"
        if reason is not None:
            self.rd.rejected.append(Rejected(event.request_id, reason, self.leader))
            return
        first = self.log.last_index() + 1
        last = self._append_commands(event.commands)
        if self.uncommitted is EMPTY_LIST:
            self.uncommitted = []
        self.uncommitted.append((last, size))
        self.uncommitted_bytes += size
        self.rd.accepted.append(Accepted(event.request_id, first, last, self.term))
        if self.progress:
            # Sent by ``ready``: every proposal stepped before it goes in one append per
            # follower, not one each (each costs an encode here, a decode and a step
            # there, and an in-flight slot).
            self.append_due = True
        else:
            replication.broadcast_append(self)

    def proposal_refusal(self) -> str | None:
        """Why this server takes no proposal now, or ``None``."""
        if self.role is not Role.LEADER:
            return "not_leader"
        if self.membership.transfer is not None:
            return "transferring"
        return None

    def _append_commands(self, commands: tuple[bytes, ...]) -> int:
        index, term, now = self.log.last_index(), self.term, self._stamp()
        command = EntryKind.COMMAND
        entries = []
        for data in commands:
            index += 1
            entries.append(Entry(index, term, command, now, data))
        self.log.append(entries)
        return index

    def append_as_leader(self, items: list[tuple[EntryKind, bytes]]) -> int:
        """Append entries of this term; a configuration takes effect at once."""
        index, now = self.log.last_index(), self._stamp()
        entries = []
        for kind, data in items:
            index += 1
            entries.append(Entry(index, self.term, kind, now, data))
            if kind is EntryKind.CONFIG:
                self.configs.append((index, Configuration.decode(data)))
        self.log.append(entries)
        return index

    def _stamp(self) -> int:
        """The leader time of the entries appended now: the wall clock, but never below
        a stamp this server already appended or received."""
        if self.wall_ms > self.stamp_ms:
            self.stamp_ms = self.wall_ms
        return self.stamp_ms

    # --- messages --------------------------------------------------------------------

    def refuse(self, reason: str) -> None:
        """Drop a message no correct peer sends (see ``refusals``), counting it."""
        self.refused += 1
        self.refusal = reason

    def _on_message(self, msg: Message) -> None:
        reason = refusals.refusal(self, msg)
        if reason is not None:
            self.refuse(reason)
            return
        if msg.term > self.term and not self._on_higher_term(msg):
            return
        if msg.term < self.term:
            self._on_lower_term(msg)
            return
        reason = refusals.refusal_in_term(self, msg)
        if reason is not None:
            self.refuse(reason)
            return
        kind = type(msg)
        leading = self.role is Role.LEADER
        if kind is AppendRequest:
            replication.on_append_request(self, msg)  # type: ignore[arg-type]
        elif kind is AppendResponse:
            if leading:
                replication.on_append_response(self, msg)  # type: ignore[arg-type]
        elif kind is Heartbeat:
            replication.on_heartbeat(self, msg)  # type: ignore[arg-type]
        elif kind is HeartbeatResponse:
            if leading:
                replication.on_heartbeat_response(self, msg)  # type: ignore[arg-type]
        elif kind is VoteRequest:
            election.on_vote_request(self, msg)  # type: ignore[arg-type]
        elif kind is VoteResponse:
            election.on_vote_response(self, msg)  # type: ignore[arg-type]
        elif kind is SnapshotChunk:
            snapshot_transfer.on_chunk(self, msg)  # type: ignore[arg-type]
        elif kind is SnapshotResponse:
            if leading:
                snapshot_transfer.on_response(self, msg)  # type: ignore[arg-type]
        elif kind is TimeoutNow and self.id in self.config.voters and not self.repairing:
            election.campaign(self, transfer=True)

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
                    election.reply_vote(self, msg, False)
                return False
            if msg.pre:
                return True
        elif type(msg) is VoteResponse and msg.pre and msg.granted:
            return True
        leader = msg.src if type(msg) in (AppendRequest, Heartbeat, SnapshotChunk) else None
        self.become_follower(msg.term, leader)
        return True

    def _on_lower_term(self, msg: Message) -> None:
        kind = type(msg)
        if kind in (AppendRequest, Heartbeat, SnapshotChunk):
            # Tell a stale leader (it may be cut off by check-quorum and pre-vote) the term.
            replication.answer_append(self, msg.src, success=False)
        elif kind is VoteRequest and msg.pre:  # type: ignore[union-attr]
            election.reply_vote(self, msg, False)  # type: ignore[arg-type]

    def heard_from_leader(self, leader: ServerId) -> None:
        assert self.role is not Role.LEADER, f"two leaders in term {self.term}"
        if self.role is not Role.FOLLOWER:
            self.become_follower(self.term, leader)
        self.leader = leader
        self.leader_contact_ms = self.now_ms
        self.reset_election_timer()

    def heard_from_follower(self, peer: ServerId) -> Progress | None:
        """The progress of ``peer``, which answered this leader: marked active (check-quorum
        counts it) and heard now. None if ``peer`` is no longer a member (the answer is
        then ignored)."""
        pr = self.progress.get(peer)
        if pr is not None:
            pr.recent_active = True
            pr.heard_ms = self.now_ms
        return pr

    # --- apply and compaction ---------------------------------------------------------

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


def _configs_in(log: RaftLog, lo: int) -> list[tuple[int, Configuration]]:
    """The configurations in ``log`` from ``lo`` (at start: all of it is in storage),
    found by kind, so that only their entries are read."""
    store = log.store
    return [
        (index, Configuration.decode(store.entry(index).data))
        for index in store.config_indexes(lo, log.last_index() + 1)
    ]


__all__ = ["Fault", "RaftOptions", "RaftServer", "RandomSource", "Role"]
