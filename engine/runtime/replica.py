"""One queue replica hosted by a node: its Raft server, its machine, and what waits on them.

Rule: a ``Replica`` is touched only on the node's event loop. It holds no I/O of its own;
``engine.runtime.node`` drives it. Proposals are futures keyed first by request id (until
the core accepts or rejects them) and then by the log index of their entry (until that
index applies: with the same term it succeeded, with another it was lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pyroaring import BitMap64

from engine.ids import ServerId
from engine.limits import Limits
from engine.queue import QueueMachine, ReceiptSeal
from engine.queue.stats import QueueStats
from engine.raft.entry import Entry
from engine.raft.server import RaftServer
from engine.runtime.driver import ReplicaDriver
from engine.runtime.meta import QueueMeta
from engine.runtime.rates import Sample, add_sample, rates_of
from engine.runtime.sleeping import Dormant
from engine.shared_empty import EMPTY_DICT, EMPTY_LIST, empty_dict, empty_list
from engine.storage import ServerLog

if TYPE_CHECKING:
    from engine.runtime.publish_groups import PublishGroup


@dataclass(slots=True)
class Proposal:
    future: asyncio.Future[object]
    on_applied: Callable[[object], object] | None
    term: int = 0
    index: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The last checkpoint written of a replica (replaced, never changed)."""

    index: int = 0
    taken_at_ms: int = 0
    bytes: int = 0


NO_CHECKPOINT = CheckpointInfo()
"""Of a replica with none yet: one for all of them (most idle queues never wrote one)."""


class Sleeps(Protocol):
    """What a replica asks of its node's hibernation (``engine.runtime.hibernation``)."""

    def wake(self, rep: Replica) -> None:
        """Rebuild the machine, core and driver of ``rep`` (asleep) from its record."""

    def log_view(self, rep: Replica) -> ServerLog:
        """The storage log of ``rep`` (asleep, its log packed), to read only."""

    def log_reads(self, rep: Replica) -> tuple[int, int]:
        """(entries read, of those from memory) of the log of ``rep`` (as ``log_view``)."""


@dataclass(slots=True)
class Replica:
    meta: QueueMeta
    server_id: ServerId
    _log: ServerLog | None
    """``log``: None while the queue sleeps (its log, packed or not, is the storage's)."""
    seal: ReceiptSeal
    """Makes and checks this queue's receipts."""
    _driver: ReplicaDriver[QueueMachine] | None = None
    """``driver``: None while the queue sleeps."""
    dormant: Dormant | None = None
    """The queue sleeps: its machine, Raft core and driver are dropped, this record
    stands for them (``engine.runtime.hibernation``)."""
    hibernation: Sleeps | None = None
    """Wakes a sleeping replica and reads its packed log (the node's, shared)."""
    touched: bool = True
    """Something happened since the idle sweep last looked (a ``process``, a wake)."""
    quiet_since_ms: int = 0
    """Monotonic time from which the sweep saw it untouched."""
    failed: Exception | None = None
    closed: bool = False
    close_error: Exception | None = None
    """Raised to callers once closed: ``QueueNotFound`` (deleted) or ``NoLeader`` (stop)."""
    next_request_id: int = 1
    proposals: dict[int, Proposal] = field(default_factory=empty_dict)
    """By request id, until the core accepts or rejects them (added to by ``own_proposals``)."""
    waiting: dict[int, Proposal] = field(default_factory=empty_dict)
    """By log index, until it applies (added to by ``own_waiting``)."""
    scheduled: bool = False
    tick_handle: asyncio.TimerHandle | None = None
    tick_due_ms: int = 0
    expire_handle: asyncio.TimerHandle | None = None
    expire_due_ms: int = 0
    expire_inflight: bool = False
    building_snapshot: bool = False
    """A worker reads the pages of the snapshot for a lagging follower (one at a time)."""
    available_seq: int = 0
    available_waiters: list[asyncio.Future[None]] = field(default_factory=empty_list)
    seen: tuple[int, str | None, int] = (-1, None, -1)
    """(role, leader, term) last seen: a change wakes ``leader_waiters``."""
    leader_waiters: list[asyncio.Future[None]] = field(default_factory=empty_list)
    members_checked: tuple[object, QueueMeta] | None = None
    """(configuration, ``meta``) that ``Membership.maybe_members_changed`` last found in
    agreement: asked after every step, it looks again only once either changed."""
    inflight_publish_bytes: int = 0
    publish_group: PublishGroup | None = None
    """The publishes that join this turn's entry (``engine.runtime.publish_groups``)."""
    checkpoint: CheckpointInfo = NO_CHECKPOINT
    meta_task: asyncio.Task[None] | None = None
    """Writes ``meta`` to its file after a change (``Catalog.write_meta``)."""
    bytes_since_capture: int = 0
    """Log bytes applied since the machine was last captured for a checkpoint (or
    restored): what a restart would apply again, bounded by
    ``Limits.replay_bytes_max``."""
    installed_live: dict[int, Entry] = field(default_factory=empty_dict)
    """Live entries of a snapshot being installed, readable until storage shows them."""
    samples: list[Sample] = field(default_factory=empty_list)
    """(ms, published, delivered, acked) about once a second, as runs, for the rates
    (``engine.runtime.rates``; a list: a deque would hold 760 bytes even while empty;
    the shared empty one until the first sample and again once asleep)."""
    _disk_lock: asyncio.Lock | None = None
    """``disk_lock`` once made."""
    live_cache: tuple[object, int, float, BitMap64, float] | None = None
    """(machine, applied index, monotonic s, live indexes, seconds it took) of the last
    observation: the live set walks every queued reference, too slow for each stats read
    (see ``observe.live_indexes``)."""
    live_build: tuple[object, int, Future[tuple[BitMap64, float]]] | None = None
    """(machine, applied index, the build on a worker) of a deep queue's live set being
    built from a frozen machine (see ``observe.live_set``)."""
    reading_ahead: bool = False
    """A read-ahead of the machine's ready pages is running (``engine.runtime.paging``)."""

    def own_proposals(self) -> dict[int, Proposal]:
        if self.proposals is EMPTY_DICT:
            self.proposals = {}
        return self.proposals

    def own_waiting(self) -> dict[int, Proposal]:
        if self.waiting is EMPTY_DICT:
            self.waiting = {}
        return self.waiting

    def release_proposals(self) -> None:
        """Once none is left: back to the shared empty dict (an emptied dict keeps its
        table, and even a new one costs an idle queue 64 bytes)."""
        assert not self.proposals
        self.proposals = EMPTY_DICT

    def release_waiting(self) -> None:
        assert not self.waiting
        self.waiting = EMPTY_DICT

    def own_available_waiters(self) -> list[asyncio.Future[None]]:
        if self.available_waiters is EMPTY_LIST:
            self.available_waiters = []
        return self.available_waiters

    def own_leader_waiters(self) -> list[asyncio.Future[None]]:
        if self.leader_waiters is EMPTY_LIST:
            self.leader_waiters = []
        return self.leader_waiters

    @property
    def disk_lock(self) -> asyncio.Lock:
        """Serialises checkpoint writes, cursor releases and compactions of this queue;
        made at the first use (an idle queue does without its 100 bytes)."""
        lock = self._disk_lock
        if lock is None:
            lock = self._disk_lock = asyncio.Lock()
        return lock

    @property
    def driver(self) -> ReplicaDriver[QueueMachine]:
        """Owns the Raft core and the machine, and acts on the core's ``Ready``s in the
        order durability requires (``Hosting.host`` sets it, right after construction).
        Reading it wakes a sleeping queue: whatever needs its live state gets it, and
        only readers of its stats look at ``dormant`` first (they do not wake it)."""
        driver = self._driver
        if driver is None:
            assert self.hibernation is not None and self.dormant is not None, "hosted first"
            self.hibernation.wake(self)
            driver = self._driver
            assert driver is not None
        return driver

    @driver.setter
    def driver(self, driver: ReplicaDriver[QueueMachine]) -> None:
        self._driver = driver

    @property
    def log(self) -> ServerLog:
        """The queue's storage log. While the queue sleeps it is the node's storage's,
        packed there (``ServerLogs.pack``), and this reads it unpacked for the caller,
        who only reads it: what changes a log wakes its queue first."""
        log = self._log
        if log is None:
            assert self.hibernation is not None and self.dormant is not None
            return self.hibernation.log_view(self)
        return log

    @log.setter
    def log(self, log: ServerLog) -> None:
        self._log = log

    def log_reads(self) -> tuple[int, int]:
        """(entries read, of those served from memory) of its log, not unpacking it."""
        log = self._log
        if log is None:
            assert self.hibernation is not None
            return self.hibernation.log_reads(self)
        return log.reads, log.reads_in_memory + log.cache_hits

    def queue_stats(self) -> QueueStats:
        """The machine's stats, or those it had when it fell asleep (not waking it)."""
        dormant = self.dormant
        return self.machine.stats() if dormant is None else dormant.stats

    def fall_asleep(self, dormant: Dormant) -> None:
        """Drop the driver (its core and machine) for ``dormant``; what pointed at them
        goes too (the live set's cache, the role last seen, the seal's keyed state)."""
        self.dormant = dormant
        self._driver = None
        self._log = None  # the node's storage keeps it (packed, ``Hibernation.pack_log``)
        self.seal.forget()
        self.live_cache = None
        self.seen = (-1, None, -1)
        self.members_checked = None
        self.samples = EMPTY_LIST  # idle for longer than the rates' window: rates are zero

    def wake_with(self, driver: ReplicaDriver[QueueMachine], log: ServerLog) -> None:
        """Awake again, with ``driver`` rebuilt from the record and ``log`` unpacked."""
        self._driver = driver
        self._log = log
        self.dormant = None
        self.touched = True

    def wake(self) -> None:
        """Wake it if it sleeps (what needs its live state wakes it by itself)."""
        if self.dormant is not None:
            _ = self.driver  # reading the driver wakes it (not an assert: ``-O`` drops those)

    @property
    def disk_busy(self) -> bool:
        """A checkpoint write, cursor release or compaction of this queue runs or waits."""
        lock = self._disk_lock
        return lock is not None and lock.locked()

    @property
    def leader_id(self) -> ServerId | None:
        """The leader this replica knows of; a sleeping one (a lone voter) leads."""
        return self.server_id if self.dormant is not None else self.raft.leader

    @property
    def raft(self) -> RaftServer:
        """The replica's Raft core (the driver's)."""
        return self.driver.raft

    @property
    def machine(self) -> QueueMachine:
        """The replica's queue machine (the driver's)."""
        return self.driver.machine

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def applied_index(self) -> int:
        dormant = self.dormant
        return self.driver.applied_index if dormant is None else dormant.applied_index

    @property
    def applied_term(self) -> int:
        dormant = self.dormant
        return self.driver.applied_term if dormant is None else dormant.applied_term

    @property
    def base_index(self) -> int:
        """The machine was restored at this index (a checkpoint's or a snapshot's):
        entries up to it are in its state and are not applied again."""
        dormant = self.dormant
        return self.driver.base_index if dormant is None else dormant.applied_index

    def sample(self, now_ms: int, limits: Limits) -> None:
        if self.dormant is not None:
            return  # nothing changes while it sleeps: its rates are zero
        if self.samples and now_ms - self.samples[-1][0] < limits.rate_sample_ms:
            return  # spares the stats
        if self.samples is EMPTY_LIST:
            self.samples = []
        add_sample(self.samples, self._counters(now_ms), limits)

    def rates(self, now_ms: int, limits: Limits) -> tuple[float, float, float]:
        """Messages per second published, delivered and acked over the last seconds."""
        if not self.samples:  # asleep, or never sampled: zeros, without reading stats
            return 0.0, 0.0, 0.0
        return rates_of(self.samples, self._counters(now_ms), limits)

    def _counters(self, now_ms: int) -> Sample:
        dormant = self.dormant
        if dormant is None:  # the machine's counters, not its whole ``stats``
            return (now_ms, *self.machine.rate_counters())
        s = dormant.stats
        return now_ms, s.published, s.delivered, s.acked


def node_of(server: str) -> str:
    """The node name of a Raft member id ``"<node>/<uid>"``."""
    return server.partition("/")[0]


def server_id(node: str, uid: str) -> ServerId:
    return ServerId(f"{node}/{uid}")


__all__ = ["NO_CHECKPOINT", "CheckpointInfo", "Proposal", "Replica", "node_of", "server_id"]
