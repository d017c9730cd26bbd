"""The queue state machine: ``apply(meta, command) -> (reply, effects)``, pure and deterministic.

Rule of this module: time comes only from ``ApplyMeta.now_ms``; state is numbers, numpy
arrays of packed refs and dicts keyed by ints (iterated in insertion order, which is the
same on every replica); nothing reads a clock, a random source or a payload.

Where a message is, at any moment (exactly one of):

* **ready**: in a lane of its priority level (``engine.queue.lanes``).
* **delayed**: waiting for its due time (``engine.queue.delayed``).
* **pending**: leased to a consumer under a delivery tag (``engine.queue.pending``).
* **dead-lettering**: waiting for the target queue to confirm it holds a copy
  (``engine.queue.dead_letters``).

Sparse extras cost memory only for messages that need them: ``_delivered_before`` (the
number of earlier deliveries, for messages given back at least once), ``_expires_at``
(per-message TTL), the delayed heap, the dead-letter table and the fallback refs.

The commands are handled by functions in modules named for them, found by the command's
kind byte (``_HANDLERS``): ``engine.queue.enqueue``, ``engine.queue.checkout``,
``engine.queue.leases`` (settle, return, discard, extend), the settle-checkout of a
receive carrying acks in ``engine.queue.checkout``, ``engine.queue.expiry``
(the expire command, time and TTL), ``engine.queue.policy_changes``; purge and
dead-letter confirmation are here. They read and write the machine's fields as its
methods would, so dispatching a command costs one function call, like a method.
This module keeps the state, what every handler shares (dead-lettering, forgetting a
message that left, the checkpoint trigger), the snapshot and the queries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from engine.errors import InvalidRequest, PageDamaged
from engine.limits import DEFAULT_LIMITS, Limits
from engine.queue import checkout, enqueue, expiry, leases, policy_changes
from engine.queue import commands as cmd
from engine.queue.commands import Kind, QueuePolicy
from engine.queue.dead_letters import DeadLetters
from engine.queue.dedup import DedupWindow
from engine.queue.delayed import Delayed
from engine.queue.effects import (
    REASON_EXPIRED,
    DeadLetterConfirmed,
    MessagesAvailable,
    Purged,
    Rejected,
)
from engine.queue.enqueue_codec import RECORD_BYTES
from engine.queue.enqueue_times import EnqueueTimes
from engine.queue.lanes import Lanes
from engine.queue.page_rebuild import rebuild_refs
from engine.queue.pages import SpilledPage
from engine.queue.paging import NOT_PAGED, Paging, QueuePager, summarize
from engine.queue.pending import Pending
from engine.queue.refs import (
    FallbackTable,
    RefParts,
    SlotRun,
    live_spans,
    sizes_of,
    slot_runs,
    total_size,
)
from engine.queue.snapshots import (
    PAGED_VERSION,
    FrozenMachine,
    MachineClock,
    SnapshotState,
    read_snapshot,
)
from engine.queue.stats import (
    ACKED,
    COUNTERS,
    DEAD_LETTERED,
    DELIVERED,
    DROPPED,
    DUPLICATES,
    EXPIRED,
    PUBLISHED,
    RETURNED,
    BrowseItem,
    MemoryUse,
    QueueStats,
)
from engine.raft.state_machine import ApplyMeta, CheckpointRequest, MachineEffect, ReleaseCursor
from engine.shared_empty import EMPTY_DICT, check_shared_empties

U64 = npt.NDArray[np.uint64]


class QueueMachine:
    """One queue. Constructed identically on every replica, then driven only by ``apply``."""

    # Slots: one per queue, thousands on a node (no instance dict each).
    __slots__ = (
        "_bytes_delayed",
        "_bytes_pending",
        "_bytes_ready",
        "_checkpoint_dead_bytes_min",
        "_counters",
        "_dead_bytes",
        "_dead_letters",
        "_deadline",
        "_deadline_known",
        "_dedup",
        "_delayed",
        "_delivered_before",
        "_expires_at",
        "_fallback",
        "_lanes",
        "_last_index",
        "_limits",
        "_now_ms",
        "_paging",
        "_pending",
        "_ready",
        "_times",
        "pager",
        "policy",
    )

    version: ClassVar[int] = 2
    """Snapshot format: 2 keeps enqueue times as ``EnqueueTimes.to_wire``; 1 (still read)
    kept 1-second samples; a checkpoint of a paged machine may be ``PAGED_VERSION`` (3),
    format 2 whose lanes name stored pages (``engine.queue.snapshots``)."""

    def __init__(
        self,
        policy: QueuePolicy | None = None,
        limits: Limits = DEFAULT_LIMITS,
        paging: Paging | None = None,
        snapshot: bytes | None = None,
    ) -> None:
        """``paging``: page the ready index (``engine.queue.paging``); None keeps every
        page in memory. ``snapshot``: the machine is ``restore``d from it (its policy
        too), its empty state not built first: a sleeping queue's wake builds one."""
        self._limits = limits
        self._paging = paging
        self.pager: QueuePager | None = None
        """The residency of the ready pages, with ``paging``: the runtime runs its
        read-ahead (``plan_read_ahead`` / ``finish_read_ahead``)."""
        if snapshot is None or policy is not None:
            self.policy = policy or QueuePolicy(
                delivery_limit=limits.delivery_limit_default,
                lease_ms=limits.lease_ms_default,
                max_message_bytes=limits.message_bytes_max,
            )
            why = policy_changes.check_policy(self.policy, limits)
            assert not why, why
        # else ``restore`` sets the snapshot's policy: a default one built and checked
        # first was a few percent of a sleeping queue's wake.
        self._checkpoint_dead_bytes_min = (
            limits.dead_bytes_per_live_checkpoint_factor * limits.checkpoint_bytes_min
        )
        """Below this many dead bytes ``_maybe_checkpoint`` cannot fire (its estimate has a
        floor), so ``apply`` skips the call."""
        self._lanes: Lanes
        if snapshot is None:
            self._reset()
        else:
            self.restore(snapshot)  # its ``_reset`` builds the state once, for its policy

    def _reset(self) -> None:
        if self.pager is not None:
            # The state is replaced (a snapshot installed): its stored pages may go.
            self._lanes.drain(read=False)
            self.pager.close()
        paging = self._paging
        if paging is not None:
            self.pager = QueuePager.from_limits(paging, self._limits, self)
        self._lanes = Lanes(self.policy.priorities, self._limits.page_refs, self.pager)
        self._fallback = FallbackTable()
        self._pending = Pending(self._limits.page_refs)
        self._delivered_before: dict[int, int] = EMPTY_DICT
        self._expires_at: dict[int, int] = EMPTY_DICT
        self._delayed = Delayed()
        self._dead_letters = DeadLetters(self._limits.dead_letter_retry_ms)
        self._dedup = DedupWindow(self._limits.dedup_window_ms, self._limits.dedup_ids_max)
        self._times = EnqueueTimes(self._limits.enqueue_time_resolution_ms)
        self._now_ms = 0
        self._last_index = 0
        self._dead_bytes = 0
        self._ready = 0
        """Messages in the lanes (the sum of their lengths, kept as a running count)."""
        self._bytes_ready = 0
        self._bytes_delayed = 0
        self._bytes_pending = 0
        self._counters = [0] * len(COUNTERS)
        """By their places in ``COUNTERS`` (``engine.queue.stats.PUBLISHED``, ...)."""
        self._deadline: int | None = None
        self._deadline_known = False
        """``_deadline`` is ``next_deadline_ms`` as of now: no command since it was
        computed changed what it reads (every command but an enqueue of messages with
        neither TTL nor delay into a queue without TTL and below its limits clears this,
        and so does every reset of the state)."""

    # === the Machine contract ======================================================

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        assert meta.index > self._last_index, (meta.index, self._last_index)
        self._last_index = meta.index
        self._now_ms = max(self._now_ms, meta.now_ms)
        ready_before = self._ready
        effects: list[MachineEffect] = []
        # The handler is found by the kind byte; ``command_kind`` gives the typed error
        # for anything that is not a known kind at the current format version.
        handler = _HANDLERS_BY_BYTE.get(command[0]) if len(command) >= 2 else None
        try:
            if handler is None or command[1] != cmd.FORMAT_VERSION:
                handler = _HANDLERS[cmd.command_kind(command)]
            reply = handler(self, meta, command, effects)
        except InvalidRequest as e:
            reply = Rejected(InvalidRequest, e.detail)
            self._deadline_known = False
        if handler is not _ON_ENQUEUE:
            self._deadline_known = False  # an enqueue clears it itself when it must
        if handler is not _ON_ENQUEUE or isinstance(reply, Rejected):
            self._dead_bytes += len(command)
        ready_after = self._ready
        if ready_before == 0 < ready_after:
            effects.append(MessagesAvailable(ready_after))
        if self._dead_bytes >= self._checkpoint_dead_bytes_min:
            self._maybe_checkpoint(meta.index, effects)
        return reply, effects

    def live_indexes(self) -> BitMap64:
        """The Raft indexes holding a message still in the queue."""
        return self._lanes.live_indexes(self._unready_refs(), self._fallback)

    def snapshot(self) -> bytes:
        """The whole state, every ref in it (format 2): the same bytes on every replica
        that applied the same entries, whatever pages each holds in memory."""
        return self.freeze().encode_inline()

    def close(self) -> None:
        """The replica is gone: its resident pages stop counting against the node."""
        if self.pager is not None:
            self.pager.close()
            self.pager = None

    def freeze(self) -> FrozenMachine:
        """The state now, for a checkpoint: the ready lanes are taken a page at a time
        (``RefFifo.freeze``), everything else copied; the ready refs, by far the largest
        part, are copied out later by ``encode``, which may run on another thread."""
        state = SnapshotState(
            version=self.version,
            policy=self.policy.to_wire(),
            clock=MachineClock(self._now_ms, self._last_index, self._dead_bytes, self._delayed.seq),
            counters=list(self._counters),
            lanes=[],  # filled in by encode
            fallback=self._fallback.to_wire(),
            pending=self._pending.to_wire(),
            delivered_before=list(self._delivered_before.items()),
            expires_at=list(self._expires_at.items()),
            delayed=self._delayed.to_wire(),
            dead_letters=self._dead_letters.to_wire(),
            dedup=self._dedup.to_wire(),
            enqueue_times=self._times.to_wire(),
        )
        return FrozenMachine(self._lanes.freeze(), state, self._unready_refs())

    def restore(self, data: bytes) -> None:
        """The ready lanes' pages become read-only views into ``data`` (no copy; see
        ``engine.queue.snapshots``), so ``data`` must not change afterwards."""
        self.restore_state(read_snapshot(data))

    def restore_state(self, state: SnapshotState) -> None:
        """``restore`` from the snapshot as ``read_snapshot`` read it: a caller that needs
        its fields too (the page handles it names) reads a deep queue's snapshot once."""
        assert state.version in (1, self.version, PAGED_VERSION), state.version
        assert state.version != PAGED_VERSION or self._paging is not None, (
            "a snapshot that names stored pages needs their page store"
        )
        self.policy = QueuePolicy(**state.policy)
        self._reset()
        clock = MachineClock(*state.clock)
        self._now_ms, self._last_index = clock.now_ms, clock.last_index
        self._dead_bytes = clock.dead_bytes
        assert len(state.counters) == len(COUNTERS), state.counters
        self._counters = [int(n) for n in state.counters]
        self._lanes.adopt(state.lanes)
        self._fallback = FallbackTable.from_wire(state.fallback)
        self._pending = Pending.from_wire(self._limits.page_refs, state.pending)
        self._delivered_before = dict(state.delivered_before) or EMPTY_DICT
        self._expires_at = dict(state.expires_at) or EMPTY_DICT
        self._delayed.adopt(state.delayed, clock.delayed_seq)
        self._dead_letters.adopt(state.dead_letters)
        self._dedup.adopt(state.dedup)
        self._times = EnqueueTimes.from_snapshot(
            self._limits.enqueue_time_resolution_ms,
            state.version,
            state.enqueue_times,
            queue_ttl=self.policy.message_ttl_ms is not None,
        )
        self._ready = self._lanes.count()
        # Empty parts (most lanes, and the delayed and leased messages of a queue that
        # slept) are not summed: each sum costs a few microseconds of a wake.
        fallback = self._fallback
        self._bytes_ready = sum(
            (total_size(refs, fallback) if len(refs) else 0)
            + sum(page.size_bytes for _at, page in spilled)
            for _head, refs, spilled in state.lanes
        )
        if self.pager is not None:
            self.pager.make_room()
            self.pager.head_moved()
        delayed, pending = self._delayed, self._pending
        self._bytes_delayed = total_size(delayed.refs(), fallback) if len(delayed) else 0
        self._bytes_pending = total_size(pending.refs(), fallback) if len(pending) else 0

    # === queries for the runtime and the API =======================================

    def ref_parts(self, ref: int) -> RefParts:
        """(Raft index, slot, size) of a ref this machine handed out and still holds."""
        return self._fallback.unpack(ref)

    def slot_runs(self, refs: Iterable[int]) -> list[SlotRun]:
        """Refs this machine handed out and still holds, in order, as runs of
        consecutive slots of one entry (``engine.queue.refs.slot_runs``)."""
        return slot_runs(refs, self._fallback)

    def stats(self) -> QueueStats:
        c = self._counters
        memory = self.memory_use()
        return QueueStats(
            messages_ready=self._ready,
            messages_delayed=len(self._delayed),
            messages_unacked=len(self._pending),
            messages_dead_lettering=len(self._dead_letters),
            bytes_ready=self._bytes_ready,
            bytes_unacked=self._bytes_pending,
            consumers=self._pending.consumers(),
            published=c[PUBLISHED],
            duplicates=c[DUPLICATES],
            delivered=c[DELIVERED],
            acked=c[ACKED],
            returned=c[RETURNED],
            dead_lettered=c[DEAD_LETTERED],
            expired=c[EXPIRED],
            dropped=c[DROPPED],
            memory_bytes=memory.total_bytes,
            memory=memory,
            last_applied=self._last_index,
            dead_bytes=self._dead_bytes,
            paging=NOT_PAGED if self.pager is None else self.pager.stats(),
        )

    def rate_counters(self) -> tuple[int, int, int]:
        """Messages published, delivered and acked so far (``stats`` without building
        it: the rates sample them on every ``process`` of the queue)."""
        c = self._counters
        return c[PUBLISHED], c[DELIVERED], c[ACKED]

    def held(self) -> int:
        """Messages it holds in any state (ready, delayed, leased, awaiting their dead
        letter's confirm): the sum of those ``stats`` counts, without building the
        stats (their memory use, consumers and paging), which a queue's live set asks
        for whenever it is rebuilt, once for each queue falling asleep."""
        return self._ready + len(self._delayed) + len(self._pending) + len(self._dead_letters)

    def at_rest(self) -> bool:
        """Nothing in it waits on time or on a consumer: no lease out, no delayed or
        expiring message, no dead letter awaiting its target queue (what a queue needs
        to sleep; read without ``stats``, which the idle sweep would otherwise build for
        every awake queue it looks at)."""
        if len(self._pending) or len(self._delayed) or len(self._dead_letters):
            return False
        return self.next_deadline_ms() is None

    def memory_use(self) -> MemoryUse:
        extras = (
            len(self._delivered_before)
            + len(self._expires_at)
            + len(self._dead_letters)
            + len(self._fallback)
            + len(self._delayed)
        )
        return MemoryUse.estimate(
            index_bytes=self._lanes.nbytes(),
            enqueue_times_bytes=self._times.nbytes(),
            leases_bytes=self._pending.nbytes(),
            extras=extras,
            priorities=self.policy.priorities,
            dedup_bytes=self._dedup.nbytes(),
        )

    def browse(self, after: int | None = None, limit: int = 100) -> list[BrowseItem]:
        """Ready messages in the order they would be delivered, without consuming them.

        ``after`` is the ``cursor`` of the last item of the previous page (None = start).
        Expired messages not yet swept may appear; delayed and leased ones do not.
        """
        limit = max(0, min(limit, self._limits.receive_messages_max))
        count = self._delivered_before.get
        return [
            BrowseItem(cursor, ref, level, count(ref, 0))
            for cursor, ref, level in self._lanes.browse(after, limit)
        ]

    def next_deadline_ms(self) -> int | None:
        """When the runtime should next propose ``encode_expire()`` (None: no timer needed).
        Computed again only after a command that may have changed it: with one publish at
        a time the runtime asks after every entry, and most change nothing here."""
        if self._deadline_known:
            return self._deadline
        deadline = self._next_deadline_ms()
        self._deadline, self._deadline_known = deadline, True
        return deadline

    def _next_deadline_ms(self) -> int | None:
        candidates: list[int] = []
        due = self._delayed.next_due_ms()
        if due is not None:
            candidates.append(due)
        lease = self._pending.next_expiry_ms()
        if lease is not None:
            candidates.append(lease)
        for lane in self._lanes.fifos:
            if lane:
                head_ms = expiry.expiry_of(self, lane.peek())
                if head_ms is not None:
                    candidates.append(head_ms)
        retry = self._dead_letters.next_retry_ms()
        if retry is not None:
            candidates.append(retry)
        return min(candidates) if candidates else None

    def pending_items(self) -> list[tuple[int, int]]:
        """(delivery tag, ref) of every leased message, in tag order."""
        return self._pending.items()

    def check_invariants(self) -> None:
        """Counts equal contents; the tests and the simulator call it after every step."""
        self._lanes.check()
        if self.pager is not None:
            self.pager.check()
        self._pending.check()
        assert self._ready == self._lanes.count()
        assert self._bytes_ready == sum(
            int(sizes_of(chunk, self._fallback).sum()) for chunk in self._lanes.chunks()
        )
        assert self._bytes_pending == int(sizes_of(self._pending.refs(), self._fallback).sum())
        assert self._bytes_delayed == total_size(self._delayed.refs(), self._fallback)
        refs = np.concatenate(list(self._ref_parts()))
        assert len(np.unique(refs)) == len(refs), "a message is in two places"
        self._dedup.check()
        held = set(refs.tolist())
        check_shared_empties()
        assert set(self._delivered_before) <= held
        assert set(self._expires_at) <= held
        s = self.stats()
        assert self.rate_counters() == (s.published, s.delivered, s.acked)
        at_rest = not (s.messages_unacked or s.messages_delayed or s.messages_dead_lettering)
        # The deadline kept since it was computed is the one computed now.
        assert not self._deadline_known or self._deadline == self._next_deadline_ms()
        assert self.at_rest() == (at_rest and self.next_deadline_ms() is None)

    # === command handlers ==========================================================

    def _on_purge(self, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]) -> object:
        """Drop every ready and delayed message (not leased ones), without dead-lettering.
        Pages that are out are not read unless a message may have extras to forget."""
        extras = bool(self._delivered_before or self._expires_at or len(self._fallback))
        chunks, unread, unread_bytes = self._lanes.drain(read=extras)
        chunks.append(self._delayed.clear())
        self._bytes_ready = self._bytes_delayed = self._ready = 0
        for chunk in chunks:
            self._forget_many(chunk)
        self._dead_bytes += unread_bytes + RECORD_BYTES * unread
        count = sum(len(chunk) for chunk in chunks) + unread
        self._counters[DROPPED] += count
        return Purged(count)

    def _on_dead_letter_confirm(
        self, meta: ApplyMeta, command: bytes, effects: list[MachineEffect]
    ) -> object:
        confirmed = self._dead_letters.confirm(cmd.decode_dead_letter_confirm(command).tolist())
        for ref in confirmed:
            self._forget(ref)
        return DeadLetterConfirmed(len(confirmed))

    # === dead-lettering ============================================================

    def _dead_letter(self, refs: list[int], reason: str, effects: list[MachineEffect]) -> None:
        """Hand messages that left the ready/pending state to the dead-letter target, or
        drop them when the queue has none."""
        if not refs:
            return
        if reason == REASON_EXPIRED:
            self._counters[EXPIRED] += len(refs)
        target = self.policy.dead_letter_queue
        if target is None:
            self._forget_many(np.array(refs, dtype=np.uint64))
            self._counters[DROPPED] += len(refs)
            return
        counts = tuple(self._delivered_before.get(ref, 0) for ref in refs)
        self._counters[DEAD_LETTERED] += len(refs)
        effects.append(self._dead_letters.hand_over(target, reason, refs, counts, self._now_ms))

    # === bookkeeping ===============================================================

    def _maybe_checkpoint(self, index: int, effects: list[MachineEffect]) -> None:
        """Ask for a checkpoint once the dead log bytes reach about twice what the checkpoint
        will weigh, then release the prefix that no live message needs."""
        held = self._ready + len(self._delayed) + len(self._pending) + len(self._dead_letters)
        estimate = max(
            held * self._limits.checkpoint_bytes_per_message_estimate,
            self._limits.checkpoint_bytes_min,
        )
        if self._dead_bytes < self._limits.dead_bytes_per_live_checkpoint_factor * estimate:
            return
        self._dead_bytes = 0
        spans = live_spans(self._lanes.spans(self._fallback), self._unready_refs(), self._fallback)
        first_live = int(spans[0].min()) if len(spans[0]) else index + 1
        self._times.prune(first_live, spans)
        effects.append(CheckpointRequest(index))
        effects.append(ReleaseCursor(first_live))

    def _forget(self, ref: int) -> None:
        """A message left the queue for good: drop its extras, count its log bytes dead."""
        self._dead_bytes += RECORD_BYTES + self._size(ref)
        if self._delivered_before:
            self._delivered_before.pop(ref, None)
        if self._expires_at:
            self._expires_at.pop(ref, None)
        self._fallback.release(ref)

    def _forget_many(self, refs: U64) -> None:
        if not len(refs):
            return
        self._dead_bytes += int(sizes_of(refs, self._fallback).sum()) + RECORD_BYTES * len(refs)
        if self._delivered_before or self._expires_at or len(self._fallback):
            for ref in refs.tolist():
                self._delivered_before.pop(ref, None)
                self._expires_at.pop(ref, None)
                self._fallback.release(ref)

    def _own_delivered_before(self) -> dict[int, int]:
        """``_delivered_before``, made the queue's own before an entry is stored."""
        if self._delivered_before is EMPTY_DICT:
            self._delivered_before = {}
        return self._delivered_before

    def _own_expires_at(self) -> dict[int, int]:
        """``_expires_at``, made the queue's own before an entry is stored."""
        if self._expires_at is EMPTY_DICT:
            self._expires_at = {}
        return self._expires_at

    def _size(self, ref: int) -> int:
        return self._fallback.size(ref)

    # === paging ====================================================================

    def describe_page(self, page: U64) -> tuple[int, int, int, bytes]:
        """``QueuePager``'s summary of a page it stores (the machine is its ``PageHost``)."""
        return summarize(page, self._fallback)

    def rebuild_page(self, lane_no: int, page: SpilledPage) -> U64 | None:
        """A damaged page of lane ``lane_no``, from its entries in the log
        (``engine.queue.page_rebuild``): possible for main lanes only; None without a
        log to read."""
        if self._paging is None or self._paging.read_log is None:
            return None
        if lane_no % 2 == 0:
            raise PageDamaged(
                f"page {page.handle} of a returns lane cannot be rebuilt", handle=page.handle
            )
        top = self.policy.priorities - 1
        entries = self._paging.read_log(list(page.index_set()))
        return rebuild_refs(page, top - lane_no // 2, top, entries, self._fallback)

    def _ref_parts(self) -> Iterator[U64]:
        """Every ref the machine holds, in parts: ready pages, leased, delayed, and those
        waiting to be dead-lettered."""
        yield from self._lanes.chunks()
        yield from self._unready_refs()

    def _unready_refs(self) -> tuple[U64, U64, U64]:
        """New arrays of the refs held outside the ready lanes: leased, delayed, and
        waiting to be dead-lettered."""
        return (
            self._pending.refs(),
            self._delayed.refs(),
            self._dead_letters.refs(),
        )


_Handler = Callable[[QueueMachine, ApplyMeta, bytes, list[MachineEffect]], object]

_HANDLERS: dict[Kind, _Handler] = {
    Kind.ENQUEUE: enqueue.on_enqueue,
    Kind.CHECKOUT: checkout.on_checkout,
    Kind.SETTLE: leases.on_settle,
    Kind.RETURN: leases.on_return,
    Kind.DISCARD: leases.on_discard,
    Kind.EXTEND: leases.on_extend,
    Kind.PURGE: QueueMachine._on_purge,
    Kind.EXPIRE: expiry.on_expire,
    Kind.POLICY: policy_changes.on_policy,
    Kind.DEAD_LETTER_CONFIRM: QueueMachine._on_dead_letter_confirm,
    Kind.SETTLE_CHECKOUT: checkout.on_settle_checkout,
}

_HANDLERS_BY_BYTE = {kind.value[0]: handler for kind, handler in _HANDLERS.items()}
_ON_ENQUEUE = enqueue.on_enqueue

__all__ = ["FrozenMachine", "QueueMachine"]
