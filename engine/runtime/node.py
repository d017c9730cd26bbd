"""The asyncio node: hosts many queue replicas and implements ``QueueEngine``.

How it runs (one event loop, two kinds of helper threads):

* **Loop.** Every replica's ``RaftServer`` and ``QueueMachine`` change only here. An
  event (a proposal, a Raft message, a timer, a finished WAL batch) is stepped into the
  core at once, and the replica is scheduled for one ``_process`` on the next turn of the
  loop, so the proposals of one turn become one ``Ready`` and one WAL append.
* **Ready**, in the order of ``engine.raft.events``: hard state and entries are queued
  in the shared WAL; ``messages`` go out; committed entries apply to the machine, which
  resolves the futures of their proposals and runs effects; ``messages_after_persist``
  wait until every WAL operation queued before them is durable.
* **WAL writer thread** (``WalWriter``): group commit of every pending operation of
  every queue, one write and one fdatasync; the batch comes back to the loop, which
  updates the mem tables, steps ``Persisted`` and releases waiting messages. Nothing is
  acknowledged before the leader's own copy is fsynced and a quorum has it.
* **Workers** (the default executor): segment flushes after a WAL roll, checkpoint
  files, compactions, queue definitions. Each is prepared on the loop, touches only the
  disk in the worker and is finished on the loop (storage is the loop's alone); a stop
  waits for every worker before it closes storage.
* **Timers**, per replica and only when needed: a Raft tick at the core's next deadline
  (heartbeats on a leader with followers, the election timeout on a follower; none for
  a lone leader) and the machine's next deadline on the leader, which proposes
  ``encode_expire()``. An idle single-replica queue costs no work at all.

A client call on a replica that does not lead is forwarded to the leader's node through
the transport (one hop); while no leader is known it waits up to
``Limits.leader_wait_ms`` and then raises ``NoLeader``. Before each proposal the core is
ticked with the node's clocks, because the core stamps entries with the last wall time it saw.

Checkpoints: ``CheckpointRequest`` serialises the machine before the next entry applies
(every replica; also once ``Limits.replay_bytes_max`` of the log has applied since the
last one, which bounds what a restart applies again, and at a clean stop, so that the
next start applies next to nothing), the file is written by a worker, then ``ReleaseCursor`` promotes it to
the snapshot and deletes segments holding only dead entries (compaction phase 1, the
only one storage offers so far). The core learns of that snapshot only when a follower
lags behind it: the checkpoint is then loaded (no payload) and shipped in chunks, then
the core reads from the log only the live entries the follower says it lacks.

Recovery: every ``queues/<uid>/queue.meta`` names a replica; its machine is restored
from the newest checkpoint and the committed entries after it are applied again (their
leader-only effects dropped); ``start`` returns once that is done. The core starts from
the snapshot's and the checkpoint's index, term and configuration only: no live entry
is read, so a restart does not grow with the depth of the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

from pyroaring import BitMap64

from engine.errors import (
    Backpressure,
    EntryDamaged,
    MessageTooLarge,
    NoLeader,
    QueueConflict,
    QueueNotFound,
    QuorraError,
    StorageFailed,
    ValidationFailed,
)
from engine.ids import NodeName, ServerId
from engine.limits import DEFAULT_LIMITS, Limits
from engine.node_key import receipt_key
from engine.queue import (
    CheckedOut,
    DeadLetter,
    Enqueued,
    Expired,
    MessagesAvailable,
    NewMessage,
    PolicyChanged,
    Purged,
    QueueMachine,
    ReceiptSeal,
    Rejected,
    Settled,
    check_receipt_text,
    encode_checkout,
    encode_dead_letter_confirm,
    encode_discard,
    encode_enqueue,
    encode_expire,
    encode_extend,
    encode_policy,
    encode_purge,
    encode_return,
    encode_settle,
    message_id,
    read_message,
)
from engine.queue.machine import FrozenMachine
from engine.raft.config import EMPTY_CONFIGURATION, Configuration
from engine.raft.events import (
    Accepted,
    AddServer,
    Completed,
    Propose,
    ReadReady,
    Ready,
    Receive,
    RemoveServer,
    SnapshotInstalled,
    Tick,
    TransferLeadership,
)
from engine.raft.events import HardState as RaftHardState
from engine.raft.events import Persisted as RaftPersisted
from engine.raft.events import Rejected as RaftRejected
from engine.raft.log import Entry, EntryKind
from engine.raft.machine import CheckpointRequest, MachineEffect, ReleaseCursor
from engine.raft.messages import Message
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.raft.snapshot import Snapshot, SnapshotMeta
from engine.runtime import observe
from engine.runtime.api import (
    BrowsedMessage,
    CheckpointRecord,
    CompactionPhase,
    CompactionRecord,
    OutgoingMessage,
    QueueArgs,
    QueueEngine,
    QueueInfo,
    ReceivedMessage,
    RecordListener,
    SegmentInfo,
    SettleResult,
    Trigger,
)
from engine.runtime.clock import SYSTEM_CLOCK, Clock
from engine.runtime.driver import ReplicaDriver
from engine.runtime.meta import (
    CONSUMER_BYTES_MAX,
    QueueMeta,
    args_with,
    check_args,
    check_message,
    check_name,
    decode_headers,
    meta_path,
    policy_of,
    read_meta,
    write_meta,
)
from engine.runtime.replica import CheckpointInfo, Proposal, Replica, node_of, server_id
from engine.runtime.transport import LocalTransport, Transport
from engine.runtime.wal_writer import WalWriter
from engine.storage import (
    Checkpoint,
    Disk,
    HardStateSaved,
    NodeStorage,
    OsDisk,
    Persisted,
    Removed,
    ServerLog,
    SnapshotReset,
    WalBatch,
    WriteFailed,
)
from engine.storage.flush import CheckpointWrite
from engine.storage.wal import AppendOp, HardState, HardStateOp
from engine.storage.wal_stats import WalStats

log = logging.getLogger("quorra.engine")
T = TypeVar("T")

_CALLS = (
    "create_replica",
    "delete_replica",
    "publish",
    "receive",
    "ack",
    "nack",
    "extend",
    "browse",
    "purge",
    "update_policy",
    "transfer",
    "add_member",
    "remove_member",
    "publish_routed",
)


STOP_GRACE_MS = 2_000
"""How long a graceful stop lets requests in flight finish."""
STOP_CHECKPOINT_BYTES_MIN = 1 << 20
"""A clean stop checkpoints a queue that applied at least this much since its last
checkpoint, so that the next start applies next to nothing again."""


class Node:
    """One Quorra node. ``Node(data_dir)`` alone is a single-node cluster."""

    def __init__(
        self,
        data_dir: Path | str,
        *,
        node_name: str = "node-1",
        limits: Limits = DEFAULT_LIMITS,
        transport: Transport | None = None,
        receipt_key: bytes | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.clock = clock
        """Timers count on its monotonic clock; entries are stamped with its wall clock."""
        self._receipt_key = receipt_key
        """Seals receipts; ``None``: derived from the data directory's secret at start."""
        self.name = NodeName(node_name)
        self.limits = limits
        self.transport: Transport = transport or LocalTransport(node_name)
        assert self.name in self.transport.nodes(), "the transport knows this node"
        self._rng = random.Random()
        self._replicas: dict[str, Replica] = {}
        """By queue name."""
        self._by_uid: dict[str, Replica] = {}
        self._failed: dict[str, tuple[QueueMeta, QuorraError]] = {}
        """Queues whose recovery was refused: listed, every call raises the error."""
        self._storage: NodeStorage | None = None
        self._writer: WalWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: RecordListener | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._jobs: set[asyncio.Future[None]] = set()
        """Storage work under way (``_job``): a stop waits for it before closing storage."""
        self._flush_task: asyncio.Task[None] | None = None
        self._batches: deque[WalBatch] = deque()
        """Finished WAL batches handed over by the writer thread, in order."""
        self._create_lock = asyncio.Lock()
        self._inflight_requests = 0
        self._heard_ms: dict[str, int] = {}
        """Monotonic time of the last Raft message from each node."""
        self._running = False
        self._stopping = False
        self._unreadable: set[str] = set()
        self._removed: dict[str, asyncio.Future[None]] = {}
        """Deletions waiting for storage's ``Removed``."""

    # === lifecycle ===================================================================

    async def start(self) -> None:
        assert self._storage is None, "a Node starts once; make a new one to restart"
        self._loop = asyncio.get_running_loop()
        self._create_lock = asyncio.Lock()
        if self._receipt_key is None:
            self._receipt_key = await asyncio.to_thread(receipt_key, self.data_dir)
        storage, metas = await asyncio.to_thread(self._open_storage)
        storage.take_over()
        self._storage = storage
        for meta in metas:
            try:
                self._host(meta)
            except QuorraError as e:
                log.error("queue %s (%s) not recovered: %s", meta.name, meta.uid, e.detail)
                self._failed[meta.name] = (meta, e)
        self._writer = WalWriter(storage.wal, self._on_wal_batch_threadsafe)
        self._writer.start()
        self._running = True
        self.transport.attach(self.name, self)
        for rep in self._replicas.values():
            self._schedule(rep)
        await self._await_recovered()

    async def _await_recovered(self) -> None:
        """Wait until every replica has applied what it knows committed, and a lone
        replica has also led once (its whole log is committed then), up to the limit."""
        loop = self._need_loop()
        deadline = loop.time() + self.limits.leader_wait_ms / 1000

        def recovered(rep: Replica) -> bool:
            raft = rep.raft
            if rep.failed is not None or rep.closed:
                return True
            if rep.meta.members == (self.name,):
                return raft.role is Role.LEADER and rep.applied_index >= raft.log.last_index()
            return rep.applied_index >= raft.commit

        while not all(recovered(rep) for rep in self._replicas.values()):
            if loop.time() > deadline:
                log.warning("start: some queues are still recovering")
                return
            await asyncio.sleep(0.005)

    def _open_storage(self) -> tuple[NodeStorage, list[QueueMeta]]:
        """In a worker, which owns the storage until ``start`` takes it over: recover it,
        flush what the WAL holds, read the queue definitions, drop orphans."""
        storage = NodeStorage.open(OsDisk(str(self.data_dir)), self.limits)
        error = storage.flush_segments()
        if error is not None:  # nothing is lost: the WAL files stay until a later flush
            log.error("start: segment flush failed: %s", error.detail)
        metas = self._read_metas(storage.disk)
        self._drop_orphans(storage, {m.uid for m in metas})
        return storage, metas

    def _read_metas(self, disk: Disk) -> list[QueueMeta]:
        metas = []
        for uid in disk.listdir("queues"):
            meta = read_meta(disk, uid)
            if meta is not None:
                metas.append(meta)
            elif disk.exists(meta_path(uid)):
                # Unreadable, not absent: keep the data for an operator, serve nothing.
                log.error("queue directory %s: definition unreadable, left alone", uid)
                self._unreadable.add(uid)
        return sorted(metas, key=lambda m: m.name)

    def _drop_orphans(self, storage: NodeStorage, uids: set[str]) -> None:
        """Directories and logs without a definition are remains of a deleted queue (the
        definition is removed first and written first)."""
        keep = uids | self._unreadable
        for uid in storage.servers():
            if uid not in keep:
                storage.remove_server(uid)  # the WAL writer is not running yet
        for uid in storage.disk.listdir("queues"):
            if uid not in keep:
                shutil.rmtree(self.data_dir / "queues" / uid, ignore_errors=True)

    async def stop(self) -> None:
        """Flush and close: everything queued reaches the WAL, rolled files reach segments."""
        await self._shutdown(abandon=False)

    async def halt(self) -> None:
        """Stop as a crash would: what the WAL writer has not taken is lost, nothing is
        flushed to segments. For failover tests; a later ``start`` recovers."""
        await self._shutdown(abandon=True)

    async def _shutdown(self, *, abandon: bool) -> None:
        if not self._running:
            return
        if not abandon:
            await self._drain_requests()
            await self._checkpoint_before_stop()
        self._running = False
        self.transport.detach(self.name)
        for rep in self._replicas.values():
            self._close_replica(rep, NoLeader("the node is stopping"))
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # A cancelled task waits for its worker (``_in_worker``); a request past the
        # grace period may still be in a job: storage closes only after every job.
        while self._jobs:
            await asyncio.wait(set(self._jobs))
        assert self._writer is not None and self._storage is not None
        await asyncio.to_thread(self._writer.stop, abandon=abandon)
        # Every batch the writer finished reaches the mem tables before a close flushes
        # them (a segment flush deletes the WAL file it came from).
        self._drain_batches()
        if self._flush_task is not None:
            await asyncio.gather(self._flush_task, return_exceptions=True)
        storage = self._storage
        if abandon:
            await asyncio.to_thread(self._close_files, storage)
        else:
            await asyncio.to_thread(_close_storage, storage)

    async def _checkpoint_before_stop(self) -> None:
        """Checkpoint every queue with ``STOP_CHECKPOINT_BYTES_MIN`` applied since its
        last checkpoint: a restart after a clean stop then restores the machine and
        applies nothing of the log (up to ``Limits.replay_bytes_max`` otherwise)."""
        for rep in list(self._replicas.values()):
            if (
                rep.failed is not None
                or rep.closed
                or rep.applied_term == 0
                or rep.bytes_since_capture < STOP_CHECKPOINT_BYTES_MIN
            ):
                continue
            cp = self._capture(rep, rep.applied_index, rep.applied_term)
            try:
                async with rep.disk_lock:
                    record = await self._write_checkpoint(rep, cp, "auto")
            except (StorageFailed, OSError) as e:
                log.error("queue %s: checkpoint at stop failed: %s", rep.name, e)
                continue
            await self._notify(record)

    async def _drain_requests(self) -> None:
        """Refuse new requests, end long polls, and give those in flight a moment."""
        self._stopping = True
        for rep in self._replicas.values():
            for f in rep.available_waiters:
                if not f.done():
                    f.set_result(None)
        loop = self._need_loop()
        deadline = loop.time() + STOP_GRACE_MS / 1000
        while self._inflight_requests and loop.time() < deadline:
            await asyncio.sleep(0.005)

    @staticmethod
    def _close_files(storage: NodeStorage) -> None:
        storage.wal.close()
        storage.cache.close()

    def set_record_listener(self, listener: RecordListener | None) -> None:
        self._listener = listener

    # === queue definitions ============================================================

    def queues(self) -> list[QueueInfo]:
        metas = [rep.meta for rep in self._replicas.values()]
        metas += [meta for meta, _e in self._failed.values()]
        return [_info(m) for m in sorted(metas, key=lambda m: m.name)]

    async def create_queue(self, name: str, args: QueueArgs) -> tuple[QueueInfo, bool]:
        check_name(name)
        nodes = self.transport.nodes()
        args = check_args(args, self.limits, len(nodes))
        async with self._admit():
            existing = self._known(name)
            if existing is not None:
                info = self._same_or_conflict(existing, args)
                await self._ensure_replicas(existing)
                return info, False
            assert args.replicas is not None
            start = nodes.index(self.name)
            members = tuple(sorted((nodes[start:] + nodes[:start])[: args.replicas]))
            meta = QueueMeta(name, uuid.uuid4().hex, args, self.clock.wall_ms(), members)
            for node in members:
                if node == self.name:
                    await self._create_replica(meta)
                else:
                    await self.transport.call(NodeName(node), "create_replica", (meta,))
            rep = self._replicas.get(name)
            if rep is not None:
                with contextlib.suppress(NoLeader):
                    await self._leader_node(rep)
                # Ready to serve once the first leader's no-op entry applied here.
                loop = self._need_loop()
                deadline = loop.time() + self.limits.leader_wait_ms / 1000
                while rep.applied_index == 0 and loop.time() < deadline and not rep.closed:
                    await asyncio.sleep(0.005)
            return _info(meta), True

    async def _ensure_replicas(self, meta: QueueMeta) -> None:
        """A create that failed half-way (a member was down) is completed by its retry."""
        for node in meta.members:
            if node != self.name:
                with contextlib.suppress(NoLeader):
                    await self.transport.call(NodeName(node), "create_replica", (meta,))

    def _known(self, name: str) -> QueueMeta | None:
        rep = self._replicas.get(name)
        if rep is not None:
            return rep.meta
        failed = self._failed.get(name)
        return failed[0] if failed else None

    @staticmethod
    def _same_or_conflict(meta: QueueMeta, args: QueueArgs) -> QueueInfo:
        if meta.args != args:
            raise QueueConflict(f"queue {meta.name} exists with other arguments")
        return _info(meta)

    async def _create_replica(self, meta: QueueMeta) -> None:
        async with self._create_lock:
            known = self._known(meta.name)
            if known is not None:
                if known.uid != meta.uid:
                    raise QueueConflict(f"queue {meta.name} exists on {self.name}")
                return
            if len(self._replicas) >= self.limits.queues_per_node_max:
                raise ValidationFailed(
                    f"a node hosts at most {self.limits.queues_per_node_max} queues"
                )
            storage = self._need_storage()
            await asyncio.to_thread(write_meta, storage.disk, meta)
            rep = self._host(meta)
            self._schedule(rep)

    async def delete_queue(self, name: str) -> None:
        async with self._admit():
            meta = self._known(name)
            if meta is None:
                raise QueueNotFound(f"no queue {name}")
            for node in meta.members:
                if node == self.name:
                    await self._delete_replica(meta.uid)
                else:
                    with contextlib.suppress(NoLeader, QueueNotFound):
                        await self.transport.call(NodeName(node), "delete_replica", (meta.uid,))

    async def _delete_replica(self, uid: str) -> None:
        rep = self._by_uid.pop(uid, None)
        if rep is not None:
            self._replicas.pop(rep.name, None)
            self._close_replica(rep, QueueNotFound(f"queue {rep.name} was deleted"))
            if rep.meta_task is not None:  # a definition being written: removed after it
                await asyncio.wait([rep.meta_task])
        for name, (meta, _e) in list(self._failed.items()):
            if meta.uid == uid:
                del self._failed[name]
        storage = self._need_storage()
        # The definition goes first: a crash after it leaves an orphan, removed at start.
        # Storage then removes the directory itself, which must hold none of our files.
        for path in (meta_path(uid), meta_path(uid) + ".tmp"):
            if storage.disk.exists(path):
                await asyncio.to_thread(storage.disk.remove, path)
        if storage.disk.exists(f"queues/{uid}"):
            await asyncio.to_thread(storage.disk.sync_dir, f"queues/{uid}")
        removed: asyncio.Future[None] = self._need_loop().create_future()
        self._removed[uid] = removed
        self._forget_storage(uid)
        try:
            await asyncio.wait_for(removed, self.limits.proposal_timeout_ms / 1000)
        except TimeoutError:
            log.warning("queue %s: removal not confirmed by storage yet", uid)
        finally:
            self._removed.pop(uid, None)

    def _forget_storage(self, uid: str) -> None:
        """Drop server ``uid`` from storage: a forget record goes through the WAL, then
        storage deletes its files (finished at recovery after a crash)."""
        self._need_storage().remove_server(uid)
        if self._writer is not None:
            self._writer.wake()

    async def update_policy(self, name: str, changes: dict[str, object]) -> QueueInfo:
        rep = self._replica(name)
        args_with(rep.meta.args, changes, self.limits)
        async with self._admit():
            result = await self._route(name, "update_policy", (name, changes))
        assert isinstance(result, QueueInfo)
        return result

    async def _update_policy_local(self, rep: Replica, changes: dict[str, object]) -> QueueInfo:
        args_with(rep.meta.args, changes, self.limits)
        reply = await self._propose(rep, encode_policy(changes))
        assert isinstance(reply, PolicyChanged), reply
        return _info(rep.meta)

    # === hosting a replica ===========================================================

    def _host(self, meta: QueueMeta) -> Replica:
        """Open the replica's storage, restore its machine and start its Raft server."""
        storage = self._need_storage()
        # A lone member cannot be repaired: damage then refuses it, its files untouched.
        rec = storage.open_server(meta.uid, repairable=len(meta.members) > 1)
        machine = QueueMachine(policy_of(meta.args, self.limits), self.limits)
        base = 0
        checkpoint = CheckpointInfo()
        if rec.checkpoint is not None:
            # The state may be a view of a mapped file: msgpack reads it without a copy.
            machine.restore(cast(bytes, rec.checkpoint.state))
            base = rec.checkpoint.index
            checkpoint = CheckpointInfo(base, 0, rec.checkpoint.file_bytes)
        snapshot, checkpoint_meta = self._raft_metas(meta.uid, rec.log, rec.checkpoint)
        hs = rec.hard_state
        hard = None
        if hs is not None:
            vote = None if hs.vote is None else ServerId(hs.vote)
            hard = RaftHardState(hs.term, vote, hs.commit)
        sid = server_id(self.name, meta.uid)
        # A replica created to join an existing group starts with no configuration: it
        # neither votes nor campaigns until the leader's entries tell it the members.
        bootstrap = EMPTY_CONFIGURATION
        if self.name in meta.members:
            bootstrap = Configuration(tuple(sorted(server_id(n, meta.uid) for n in meta.members)))
        now, wall = self.clock.monotonic_ms(), self.clock.wall_ms()
        lone = meta.members == (self.name,)
        # A lone voter campaigns on its first tick instead of after an election timeout.
        start_ms = now - self.limits.election_timeout_ms_max if lone else now
        options = RaftOptions(sid, random.Random(self._rng.getrandbits(64)), self.limits)
        if rec.repairing:
            log.warning("queue %s: repairing from its peers: %s", meta.name, rec.repair_reason)
        raft = RaftServer(
            options,
            rec.log,
            hard,
            snapshot,
            bootstrap,
            max(0, start_ms),
            checkpoint_meta,
            repair=rec.repairing,
            wall_ms=wall,
        )
        assert self._receipt_key is not None, "start() loads the key before hosting"
        seal = ReceiptSeal(self._receipt_key, meta.uid)
        rep = Replica(meta, sid, raft, machine, rec.log, seal, checkpoint=checkpoint)
        rep.driver = ReplicaDriver(
            raft,
            machine,
            ReplicaIo(self, rep),
            base_index=base,
            replay_until=rec.log.last_index(),
            hard_state_written=(0, None) if hs is None else (hs.term, hs.vote),
        )
        if rec.checkpoint is not None:  # stats must not walk a deep queue at start
            observe.seed_live_set(rep, base, rec.checkpoint.live_indexes)
        if lone:
            raft.step(Tick(now, wall))
        self._replicas[meta.name] = rep
        self._by_uid[meta.uid] = rep
        return rep

    def _raft_metas(
        self, uid: str, server_log: ServerLog, cp: Checkpoint | None
    ) -> tuple[SnapshotMeta | None, SnapshotMeta | None]:
        """Where the core starts: the snapshot's and the restored checkpoint's index, term
        and configuration. No live entry is read: a restart does not grow with depth."""
        index = server_log.snapshot_index()
        snapshot = None
        if index:
            if cp is not None and cp.index == index:
                config = Configuration.decode(cp.config)
            else:
                snap = self._raft_snapshot(uid, index)
                assert snap is not None
                config = snap.config
            snapshot = SnapshotMeta(index, server_log.snapshot_term(), config)
        checkpoint = None
        if cp is not None and cp.index >= index:
            checkpoint = SnapshotMeta(cp.index, cp.term, Configuration.decode(cp.config))
        return snapshot, checkpoint

    def _raft_snapshot(self, uid: str, index: int) -> Snapshot | None:
        """The storage snapshot as the core ships it to a follower that lags behind it:
        the checkpoint only; the core reads the live entries the follower lacks."""
        if index == 0:
            return None
        cp = self._need_storage().checkpoints(uid).read_snapshot()
        if cp is None or cp.index != index:
            raise StorageFailed(f"queue {uid}: snapshot at {index} unreadable")
        config = Configuration.decode(cp.config)
        return Snapshot(cp.index, cp.term, config, bytes(cp.state), cp.live_indexes)

    def _close_replica(self, rep: Replica, error: QuorraError) -> None:
        rep.closed = True
        rep.close_error = error
        for handle in (rep.tick_handle, rep.expire_handle):
            if handle is not None:
                handle.cancel()
        for p in [*rep.proposals.values(), *rep.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(error)
        rep.proposals.clear()
        rep.waiting.clear()
        for f in [*rep.available_waiters, *rep.leader_waiters]:
            if not f.done():
                f.set_result(None)

    # === the Raft loop ===============================================================

    def _schedule(self, rep: Replica) -> None:
        if not rep.scheduled and not rep.closed:
            rep.scheduled = True
            self._need_loop().call_soon(self._process, rep)

    def _process(self, rep: Replica) -> None:
        rep.scheduled = False
        if rep.closed or isinstance(rep.failed, EntryDamaged):
            return
        raft = rep.raft
        try:
            rep.driver.process()
        except EntryDamaged as e:
            self._damaged(rep, e)
            return
        except StorageFailed as e:
            self._fail(rep, e)
            return
        rep.sample(self.clock.monotonic_ms())
        self._maybe_members_changed(rep)
        seen = (int(raft.role), raft.leader, raft.term)
        if seen != rep.seen:
            became_leader = raft.role is Role.LEADER and rep.seen[0] != int(Role.LEADER)
            rep.seen = seen
            for f in rep.leader_waiters:
                if not f.done():
                    f.set_result(None)
            rep.leader_waiters.clear()
            if became_leader:
                rep.expire_inflight = False
        self._arm_tick(rep)
        if raft.role is Role.LEADER:
            self._arm_expire(rep)

    def _submit(self, rep: Replica, op: AppendOp | HardStateOp) -> None:
        storage = self._need_storage()
        failed = storage.log(rep.uid).failed
        if failed is not None:
            raise failed
        storage.wal.submit(op)

    def _install(self, rep: Replica, snap: Snapshot, given: list[Entry]) -> None:
        """A snapshot from the leader replaces this replica's log and state. ``given`` are
        the live entries this replica lacked; storage keeps the others it holds."""
        storage = self._need_storage()
        # Until SnapshotReset the log view drops its segments: serve the live entries
        # from memory meanwhile (storage reads the held ones to write them anyway).
        installed = {e.index: e for e in given}
        for index in snap.live_indexes - BitMap64(installed):
            installed[index] = rep.log.read(index)
        cp = Checkpoint(
            snap.index,
            snap.term,
            QueueMachine.version,
            snap.config.encode(),
            snap.live_indexes,
            snap.machine_state,
        )
        size = storage.install_snapshot(rep.uid, cp, given)
        rep.installed_live = installed
        rep.checkpoint = CheckpointInfo(snap.index, self.clock.wall_ms(), size)
        observe.seed_live_set(rep, snap.index, snap.live_indexes)

    def _send(self, rep: Replica, msg: Message) -> None:
        self.transport.send(NodeName(node_of(msg.dst)), rep.uid, msg)

    def on_raft_message(self, uid: str, message: Message) -> None:
        """From the transport: a message for the replica of group ``uid``."""
        self._heard_ms[node_of(message.src)] = self.clock.monotonic_ms()
        rep = self._by_uid.get(uid)
        if rep is None or rep.closed or rep.failed is not None or not self._running:
            return
        try:
            # The core's clock moves first: a heartbeat restarts the election timer from
            # now, not from the last tick (a follower ticks only at its deadline).
            self._tick(rep)
            rep.raft.step(Receive(message))
        except EntryDamaged as e:
            self._damaged(rep, e)
            return
        self._schedule(rep)

    def _on_rejected(self, rep: Replica, rej: RaftRejected) -> None:
        if rej.request_id == 0:
            return
        p = rep.proposals.pop(rej.request_id, None)
        if p is None or p.future.done():
            return
        if rej.reason == "backpressure":
            p.future.set_exception(Backpressure(f"queue {rep.name}: too many uncommitted bytes"))
        elif rej.reason == "change_pending":
            p.future.set_exception(
                QueueConflict(f"queue {rep.name}: another membership change is in progress")
            )
        else:
            p.future.set_exception(NoLeader(f"queue {rep.name}: {rej.reason}"))

    # --- durability ------------------------------------------------------------------

    def _on_wal_batch_threadsafe(self, batch: WalBatch) -> None:
        """In the writer thread: hand the batch over in order (deque appends are atomic)."""
        self._batches.append(batch)
        loop = self._loop
        assert loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed after a halt
            loop.call_soon_threadsafe(self._drain_batches)

    def _drain_batches(self) -> None:
        while self._batches:
            self._on_wal_batch(self._batches.popleft())

    def _on_wal_batch(self, batch: WalBatch) -> None:
        storage = self._storage
        if storage is None:
            return
        for event in storage.complete(batch):
            if isinstance(event, Removed):
                waiter = self._removed.get(event.uid)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                continue
            rep = self._by_uid.get(event.uid)
            if rep is None or rep.closed:
                continue
            if isinstance(event, WriteFailed):
                self._fail(rep, event.error)
                continue
            if isinstance(event, Persisted):
                rep.driver.written(RaftPersisted(event.index, event.term))
            elif isinstance(event, SnapshotReset):
                rep.driver.written(SnapshotInstalled(event.index, event.term))
                rep.installed_live.clear()  # storage holds them now
            else:
                assert isinstance(event, HardStateSaved)
                rep.driver.written(None)
            self._schedule(rep)
        if storage.rolled_wal_files() and self._flush_task is None and self._running:
            self._flush_task = self._need_loop().create_task(self._flush_segments())

    async def _flush_segments(self) -> None:
        storage = self._need_storage()
        try:
            while (flush := storage.prepare_segment_flush()) is not None:
                await self._in_worker(flush.write)
                storage.finish_segment_flush(flush)
        except StorageFailed as e:
            # Nothing is lost: the entries stay in the mem tables and the WAL file stays;
            # the next finished WAL batch tries again.
            log.error("segment flush failed: %s", e.detail)
        finally:
            self._flush_task = None

    def _damaged(self, rep: Replica, error: EntryDamaged) -> None:
        """A read met damaged data: the repair is recorded and the replica stops serving
        (a leader so steps down: it no longer sends heartbeats); the next start of the
        node opens it in repair mode, repaired from its peers."""
        if rep.failed is not None:
            return  # recorded already: a second record would reset the replica
        try:
            self._need_storage().mark_damaged(rep.uid, error)
        except StorageFailed as e:
            log.error("queue %s: the repair could not be recorded: %s", rep.name, e.detail)
        detail = f"{error.detail}; repaired from its peers at the next start"
        self._fail(rep, EntryDamaged(detail, index=error.index))

    def _fail(self, rep: Replica, error: Exception) -> None:
        """The disk refused a write of this queue: it refuses further writes."""
        if rep.failed is not None:
            return
        log.error("queue %s: storage failed: %s", rep.name, error)
        rep.failed = error if isinstance(error, StorageFailed) else StorageFailed(str(error))
        for p in [*rep.proposals.values(), *rep.waiting.values()]:
            if not p.future.done():
                p.future.set_exception(rep.failed)
        rep.proposals.clear()
        rep.waiting.clear()

    # --- applying --------------------------------------------------------------------

    def _applied(self, rep: Replica, e: Entry, reply: object, effects: list[MachineEffect]) -> None:
        rep.bytes_since_capture += len(e.data)
        if effects or rep.bytes_since_capture >= self.limits.replay_bytes_max:
            # Replay throws leader-only effects away (the machine repeats what must
            # happen: unconfirmed dead letters are emitted again).
            leader = rep.raft.role is Role.LEADER and e.index > rep.driver.replay_until
            self._perform(rep, effects, e, leader)
        if isinstance(reply, PolicyChanged):
            self._policy_changed(rep)
        elif isinstance(reply, Expired):
            rep.expire_inflight = False
        p = rep.waiting.pop(e.index, None)
        if p is not None and not p.future.done():
            self._resolve(rep, p, e, reply)

    def _passed(self, rep: Replica, e: Entry) -> None:
        p = rep.waiting.pop(e.index, None)
        if p is not None and not p.future.done():
            self._resolve(rep, p, e, None)

    def _resolve(self, rep: Replica, p: Proposal, e: Entry, reply: object) -> None:
        if p.term != e.term or e.kind is not EntryKind.COMMAND:
            p.future.set_exception(NoLeader(f"queue {rep.name}: leadership changed, retry"))
        elif isinstance(reply, Rejected):
            p.future.set_exception(reply.to_error())
        else:
            try:
                p.future.set_result(p.on_applied(reply) if p.on_applied else reply)
            except QuorraError as err:
                p.future.set_exception(err)

    def _perform(self, rep: Replica, effects: list[MachineEffect], e: Entry, leader: bool) -> None:
        checkpoint: Captured | None = None
        for effect in effects:
            if isinstance(effect, MessagesAvailable):
                if leader:
                    rep.available_seq += 1
                    for f in rep.available_waiters:
                        if not f.done():
                            f.set_result(None)
                    rep.available_waiters.clear()
            elif isinstance(effect, DeadLetter):
                if leader:
                    self._spawn(self._dead_letter(rep, effect))
            elif isinstance(effect, CheckpointRequest):
                checkpoint = self._capture(rep, effect.index, e.term)
            elif isinstance(effect, ReleaseCursor):
                self._spawn(self._auto_checkpoint(rep, checkpoint, effect.index))
                checkpoint = None
        if checkpoint is None and rep.bytes_since_capture >= self.limits.replay_bytes_max:
            # The machine asks for checkpoints when dead entries pile up; a queue whose
            # messages all stay gets one here, so that a restart applies at most this
            # much of the log again whatever the depth of the queue.
            checkpoint = self._capture(rep, e.index, e.term)
        if checkpoint is not None:
            self._spawn(self._auto_checkpoint(rep, checkpoint, None))

    def _capture(self, rep: Replica, index: int, term: int) -> Captured:
        """The machine state as of ``index``, taken before the next entry applies: frozen
        here, encoded by the worker that writes it (``Captured.build``)."""
        rep.bytes_since_capture = 0
        config = rep.raft.config_at(index).encode()
        return Captured(index, term, rep.machine.version, config, rep.machine.freeze())

    def _policy_changed(self, rep: Replica) -> None:
        policy = rep.machine.policy
        changes = {name: getattr(policy, name) for name in policy.to_wire()}
        args = dataclasses.replace(rep.meta.args, **changes)
        rep.meta = dataclasses.replace(rep.meta, args=args)
        self._write_meta(rep)

    def _write_meta(self, rep: Replica) -> None:
        """Write the replica's definition after a change (policy, members), so that a
        later start lists it: in a worker, one write at a time per replica, the newest
        definition last. A stop waits for it (a job); a deletion too, before it removes
        the file."""
        if rep.meta_task is None:
            rep.meta_task = self._need_loop().create_task(self._write_metas(rep))

    async def _write_metas(self, rep: Replica) -> None:
        disk = self._need_storage().disk
        written: QueueMeta | None = None
        try:
            async with self._job():
                # A deleted replica is no longer in ``_by_uid``: its file stays removed.
                while rep.meta is not written and self._by_uid.get(rep.uid) is rep:
                    written = rep.meta
                    await self._in_worker(write_meta, disk, written)
        except OSError as e:
            log.error("queue %s: definition not written: %s", rep.name, e)
        finally:
            rep.meta_task = None

    # --- timers ----------------------------------------------------------------------

    def _arm_tick(self, rep: Replica) -> None:
        due = rep.raft.next_deadline_ms()
        if due is None:
            return
        if rep.tick_handle is not None and rep.tick_due_ms <= due:
            return
        if rep.tick_handle is not None:
            rep.tick_handle.cancel()
        rep.tick_due_ms = due
        rep.tick_handle = self._call_at_ms(due - self.clock.monotonic_ms(), self._on_tick, rep)

    def _on_tick(self, rep: Replica) -> None:
        rep.tick_handle = None
        if rep.closed or rep.failed is not None:
            return
        try:
            self._tick(rep)
        except EntryDamaged as e:
            self._damaged(rep, e)
            return
        self._maybe_offer_snapshot(rep)
        self._schedule(rep)

    def _maybe_offer_snapshot(self, rep: Replica) -> None:
        """Hand the core the storage snapshot once a follower lags behind it (its entries
        are gone from the log). Built only then; it carries no payload: the core reads the
        live entries the follower lacks from the log as it sends them."""
        index = rep.log.snapshot_index()
        if not rep.driver.wants_snapshot(index):
            return
        try:
            snapshot = self._raft_snapshot(rep.uid, index)
        except (StorageFailed, LookupError) as e:
            log.error("queue %s: snapshot for a lagging follower unavailable: %s", rep.name, e)
            return
        rep.driver.offer_snapshot(snapshot)

    def _arm_expire(self, rep: Replica) -> None:
        if rep.expire_inflight or rep.failed is not None:
            return
        due = rep.machine.next_deadline_ms()
        if due is None:
            return
        if rep.expire_handle is not None and rep.expire_due_ms <= due:
            return
        if rep.expire_handle is not None:
            rep.expire_handle.cancel()
        rep.expire_due_ms = due
        # The machine's deadlines are leader times, stamped from the wall clock.
        rep.expire_handle = self._call_at_ms(due - self.clock.wall_ms(), self._on_expire, rep)

    def _on_expire(self, rep: Replica) -> None:
        rep.expire_handle = None
        if rep.closed or rep.failed is not None or rep.raft.role is not Role.LEADER:
            return
        rep.expire_inflight = True

        async def expire() -> None:
            try:
                await self._propose(rep, encode_expire())
            except QuorraError:
                pass
            finally:
                rep.expire_inflight = False
                if not rep.closed and rep.raft.role is Role.LEADER:
                    self._arm_expire(rep)

        self._spawn(expire())

    def _call_at_ms(
        self, delay_ms: int, fn: Callable[[Replica], None], rep: Replica
    ) -> asyncio.TimerHandle:
        loop = self._need_loop()
        delay_s = max(0.0, delay_ms / 1000) + 0.001
        return loop.call_at(loop.time() + delay_s, fn, rep)

    def _tick(self, rep: Replica) -> None:
        """Step the core's clocks; before each proposal too, since the core stamps
        entries with the last wall time it saw."""
        rep.raft.step(Tick(self.clock.monotonic_ms(), self.clock.wall_ms()))

    # === proposals and routing ==========================================================

    async def _propose(
        self,
        rep: Replica,
        command: bytes,
        on_applied: Callable[[object], object] | None = None,
    ) -> object:
        if rep.closed:
            raise rep.close_error or QueueNotFound(f"queue {rep.name} is gone")
        if rep.failed is not None:
            raise rep.failed
        if rep.raft.role is not Role.LEADER:
            raise NoLeader(f"queue {rep.name}: this replica does not lead")
        request_id = rep.next_request_id
        rep.next_request_id += 1
        future: asyncio.Future[object] = self._need_loop().create_future()
        rep.proposals[request_id] = Proposal(future, on_applied)
        self._tick(rep)
        rep.raft.step(Propose(request_id, (command,)))
        self._schedule(rep)
        timeout_s = self.limits.proposal_timeout_ms / 1000
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise NoLeader(f"queue {rep.name}: no quorum in time; the outcome is unknown") from None
        finally:
            rep.proposals.pop(request_id, None)

    def _replica(self, name: str) -> Replica:
        rep = self._replicas.get(name)
        if rep is None:
            failed = self._failed.get(name)
            if failed is not None:
                raise failed[1]
            raise QueueNotFound(f"no queue {name}")
        return rep

    async def _leader_node(self, rep: Replica) -> NodeName:
        """The node of the replica's leader; waits for an election up to the limit."""
        loop = self._need_loop()
        deadline = loop.time() + self.limits.leader_wait_ms / 1000
        while True:
            if rep.closed:
                raise rep.close_error or QueueNotFound(f"queue {rep.name} is gone")
            raft = rep.raft
            if raft.role is Role.LEADER:
                return self.name
            if raft.leader is not None:
                return NodeName(node_of(raft.leader))
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NoLeader(f"queue {rep.name} has no leader yet")
            waiter: asyncio.Future[None] = loop.create_future()
            rep.leader_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)

    async def _route(self, name: str, method: str, args: tuple[object, ...]) -> object:
        rep = self._replica(name)
        node = await self._leader_node(rep)
        if node == self.name:
            return await self._local(method, args)
        try:
            return await self.transport.call(node, method, args)
        except QueueNotFound:
            # This node hosts the queue: the node it took for the leader no longer does.
            raise NoLeader(f"queue {name}: its leader moved, retry") from None

    async def on_call(self, method: str, args: tuple[object, ...]) -> object:
        """From the transport: a peer's request (never forwarded again)."""
        if not self._running:
            raise NoLeader(f"node {self.name} is stopping")
        assert method in _CALLS, method
        if method == "create_replica":
            meta = args[0]
            assert isinstance(meta, QueueMeta)
            await self._create_replica(meta)
            return None
        if method == "delete_replica":
            await self._delete_replica(str(args[0]))
            return None
        if method == "publish_routed":  # a dead-letter copy from a node without the target
            name, batch = args
            assert isinstance(name, str) and isinstance(batch, list)
            return await self.publish(name, batch)
        return await self._local(method, args)

    async def _local(self, method: str, args: tuple[Any, ...]) -> object:
        rep = self._replica(args[0])
        if rep.raft.role is not Role.LEADER:
            raise NoLeader(f"queue {rep.name}: leadership moved, retry")
        if method == "publish":
            return await self._publish_local(rep, args[1])
        if method == "receive":
            return await self._receive_local(rep, *args[1:])
        if method in ("ack", "nack", "extend"):
            return await self._settle_local(rep, args[1], args[2], args[3])
        if method == "browse":
            return self._browse_local(rep, args[1], args[2])
        if method == "purge":
            reply = await self._propose(rep, encode_purge())
            assert isinstance(reply, Purged)
            return reply.count
        if method == "add_member":
            return await self._add_member_local(rep, args[1])
        if method == "remove_member":
            return await self._remove_member_local(rep, args[1])
        if method == "transfer":
            await self._transfer_local(rep, args[1])
            return None
        assert method == "update_policy"
        return await self._update_policy_local(rep, args[1])

    @contextlib.asynccontextmanager
    async def _admit(self) -> Any:
        if not self._running or self._stopping:
            raise NoLeader(f"node {self.name} is not running")
        if self._inflight_requests >= self.limits.inflight_requests_per_node_max:
            raise Backpressure(f"node {self.name}: too many requests in flight")
        self._inflight_requests += 1
        try:
            yield
        finally:
            self._inflight_requests -= 1

    # === messages ===================================================================

    async def publish(self, name: str, messages: list[OutgoingMessage]) -> list[int]:
        """Each message is checked once, where the batch is encoded (the leader's node)."""
        self._replica(name)
        if not messages:
            raise ValidationFailed("a publish holds at least one message")
        if len(messages) > self.limits.batch_messages_max:
            raise MessageTooLarge(f"a batch holds at most {self.limits.batch_messages_max}")
        async with self._admit():
            result = await self._route(name, "publish", (name, messages))
        assert isinstance(result, list)
        return result

    async def _publish_local(self, rep: Replica, messages: list[OutgoingMessage]) -> list[int]:
        command = encode_enqueue(self._new_messages(rep, messages))
        size = len(command)
        if size > self.limits.batch_bytes_max:
            raise MessageTooLarge(f"a batch is at most {self.limits.batch_bytes_max} bytes")
        if rep.inflight_publish_bytes + size > self.limits.inflight_publish_bytes_per_queue_max:
            raise Backpressure(f"queue {rep.name}: too many publish bytes in flight")
        rep.inflight_publish_bytes += size
        try:
            reply = await self._propose(rep, command)
        finally:
            rep.inflight_publish_bytes -= size
        assert isinstance(reply, Enqueued), reply
        return list(reply.ids)

    def _new_messages(self, rep: Replica, messages: list[OutgoingMessage]) -> list[NewMessage]:
        """The batch to encode, each message checked. A message with a ``bytes`` body and
        every other field at its default (most of them) needs only its size checked;
        the others go through ``check_message``."""
        policy = rep.machine.policy
        body_bytes_max = policy.max_message_bytes
        batch: list[NewMessage] = []
        for m in messages:
            body = m.body
            if (
                type(body) is bytes
                and m.headers == {}
                and type(m.priority) is int
                and m.priority == 0
                and m.ttl_ms is None
                and type(m.delay_ms) is int
                and m.delay_ms == 0
                and m.dedup_id is None
            ):
                if len(body) > body_bytes_max:
                    raise MessageTooLarge(f"a message is larger than {body_bytes_max} bytes")
                batch.append(NewMessage(body))
                continue
            batch.append(
                NewMessage(
                    bytes(body),
                    check_message(m, policy, self.limits),
                    min(m.priority, 255),
                    m.ttl_ms,
                    m.delay_ms,
                    None if m.dedup_id is None else m.dedup_id.encode(),
                )
            )
        return batch

    async def receive(
        self,
        name: str,
        *,
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
    ) -> list[ReceivedMessage]:
        self._replica(name)
        limits = self.limits
        if not 1 <= len(consumer.encode()) <= CONSUMER_BYTES_MAX:
            raise ValidationFailed(f"consumer is 1..{CONSUMER_BYTES_MAX} bytes")
        if not 1 <= max_messages <= limits.receive_messages_max:
            raise ValidationFailed(f"max_messages must be 1..{limits.receive_messages_max}")
        if not 0 <= wait_ms <= limits.receive_wait_ms_max:
            raise ValidationFailed(f"wait_ms must be 0..{limits.receive_wait_ms_max}")
        if lease_ms is not None and not 1 <= lease_ms <= limits.lease_ms_max:
            raise ValidationFailed(f"lease_ms must be 1..{limits.lease_ms_max}")
        async with self._admit():
            args = (name, consumer, max_messages, wait_ms, lease_ms)
            result = await self._route(name, "receive", args)
        assert isinstance(result, list)
        return result

    async def _receive_local(
        self, rep: Replica, consumer: str, max_messages: int, wait_ms: int, lease_ms: int | None
    ) -> list[ReceivedMessage]:
        loop = self._need_loop()
        deadline = loop.time() + wait_ms / 1000
        command = encode_checkout(consumer, max_messages, lease_ms or 0)
        while True:
            result = await self._propose(rep, command, lambda r: self._deliveries(rep, r))
            assert isinstance(result, tuple)
            messages, seq = result
            remaining = deadline - loop.time()
            if messages or remaining <= 0:
                return list(messages)
            while rep.available_seq <= seq and not rep.closed and not self._stopping:
                waiter: asyncio.Future[None] = loop.create_future()
                rep.available_waiters.append(waiter)
                try:
                    await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return []
            if self._stopping:
                return []
            if rep.raft.role is not Role.LEADER:
                raise NoLeader(f"queue {rep.name}: leadership moved, retry")

    def _deliveries(self, rep: Replica, reply: object) -> tuple[list[ReceivedMessage], int]:
        """Runs as the checkout applies: read each leased message from the log."""
        assert isinstance(reply, CheckedOut), reply
        out: list[ReceivedMessage] = []
        entries: dict[int, Entry] = {}
        machine = rep.machine
        expires_ms = reply.lease_expires_ms
        seal = rep.seal.seal
        for tag, ref, priority, count in zip(
            reply.tags, reply.refs, reply.priorities, reply.delivery_counts, strict=True
        ):
            parts = machine.ref_parts(ref)
            index, slot = parts.index, parts.slot
            entry = entries.get(index)
            if entry is None:
                entry = entries[index] = self._entry(rep, index)
            view = read_message(entry.data, slot)
            out.append(
                ReceivedMessage(
                    id=message_id(index, slot),
                    receipt=seal(tag, ref),
                    body=bytes(view.body),
                    headers=decode_headers(view.headers),
                    priority=priority,
                    delivery_count=count,
                    published_at_ms=entry.now_ms,
                    lease_expires_at_ms=expires_ms,
                )
            )
        return out, rep.available_seq

    def _entry(self, rep: Replica, index: int) -> Entry:
        entry = rep.installed_live.get(index)
        if entry is not None:
            return entry
        try:
            return rep.log.read(index)
        except LookupError as e:
            raise StorageFailed(f"queue {rep.name}: entry {index} is missing") from e
        except EntryDamaged as e:
            # With peers, the replica stops (a leader steps down) and is repaired at the
            # next start; the message, leased to nobody who got it, is delivered again by
            # the next leader once the lease ends. A lone member only fails this read.
            if len(rep.meta.members) > 1:
                self._damaged(rep, e)
            raise

    async def ack(self, name: str, receipts: list[str]) -> SettleResult:
        return await self._settle(name, "ack", receipts, 0)

    async def nack(self, name: str, receipts: list[str], *, requeue: bool) -> SettleResult:
        return await self._settle(name, "nack" if requeue else "discard", receipts, 0)

    async def extend(self, name: str, receipts: list[str], lease_ms: int) -> SettleResult:
        if not 1 <= lease_ms <= self.limits.lease_ms_max:
            raise ValidationFailed(f"lease_ms must be 1..{self.limits.lease_ms_max}")
        return await self._settle(name, "extend", receipts, lease_ms)

    async def _settle(
        self, name: str, how: str, receipts: list[str], lease_ms: int
    ) -> SettleResult:
        self._replica(name)
        if not receipts:
            return SettleResult(0, ())
        if len(receipts) > self.limits.receive_messages_max:
            raise ValidationFailed(f"at most {self.limits.receive_messages_max} receipts")
        for r in receipts:
            check_receipt_text(r)
        method = "extend" if how == "extend" else ("nack" if how != "ack" else "ack")
        async with self._admit():
            result = await self._route(name, method, (name, how, receipts, lease_ms))
        assert isinstance(result, SettleResult)
        return result

    async def _settle_local(
        self, rep: Replica, how: str, receipts: list[str], lease_ms: int
    ) -> SettleResult:
        """Check each receipt's MAC here, on the leader, before anything is proposed: a
        receipt this queue did not make (forged, altered, another queue's) is reported
        stale without reaching the machine, as a receipt whose lease ended. Each node
        seals with its own key (engine/node_key.py): after leadership moves, the old
        leader's receipts are stale (their messages are delivered again when the leases
        end) until the nodes of a cluster share one secret."""
        open_receipt = rep.seal.open
        opened = [open_receipt(r) for r in receipts]
        pairs = [p for p in opened if p is not None]
        if not pairs:
            return SettleResult(0, tuple(range(len(receipts))))
        if how == "ack":
            command = encode_settle(pairs)
        elif how == "nack":
            command = encode_return(pairs)
        elif how == "discard":
            command = encode_discard(pairs)
        else:
            command = encode_extend(pairs, lease_ms)
        reply = await self._propose(rep, command)
        assert isinstance(reply, Settled), reply
        if len(pairs) == len(receipts):
            return SettleResult(reply.count, reply.stale)
        sent = [i for i, p in enumerate(opened) if p is not None]
        refused = [i for i, p in enumerate(opened) if p is None]
        stale = sorted(refused + [sent[k] for k in reply.stale])
        return SettleResult(reply.count, tuple(stale))

    async def browse(self, name: str, *, after: int | None, limit: int) -> list[BrowsedMessage]:
        self._replica(name)
        if not 1 <= limit <= self.limits.receive_messages_max:
            raise ValidationFailed(f"limit must be 1..{self.limits.receive_messages_max}")
        if after is not None and after < 0:
            raise ValidationFailed("after must be a cursor from an earlier page")
        async with self._admit():
            result = await self._route(name, "browse", (name, after, limit))
        assert isinstance(result, list)
        return result

    def _browse_local(self, rep: Replica, after: int | None, limit: int) -> list[BrowsedMessage]:
        out = []
        for item in rep.machine.browse(after, limit):
            parts = rep.machine.ref_parts(item.ref)
            index, slot = parts.index, parts.slot
            entry = self._entry(rep, index)
            view = read_message(entry.data, slot)
            out.append(
                BrowsedMessage(
                    id=message_id(index, slot),
                    cursor=item.cursor,
                    body=bytes(view.body),
                    headers=decode_headers(view.headers),
                    priority=item.priority,
                    delivery_count=item.delivery_count,
                    published_at_ms=entry.now_ms,
                )
            )
        return out

    async def purge(self, name: str) -> int:
        async with self._admit():
            result = await self._route(name, "purge", (name,))
        assert isinstance(result, int)
        return result

    # === membership ==================================================================

    def _maybe_members_changed(self, rep: Replica) -> None:
        """The group's configuration changed (a config entry is in the log): the queue's
        definition follows it, so a restart bootstraps from the right members."""
        members = tuple(sorted({node_of(m) for m in rep.raft.config.members}))
        if not members or members == rep.meta.members or self.name not in members:
            return
        rep.meta = dataclasses.replace(rep.meta, members=members)
        self._write_meta(rep)

    async def add_member(self, name: str, node: str) -> QueueInfo:
        """Add a replica of the queue on ``node`` (``POST /queues/{name}/members``): it
        joins as a learner, catches up, and becomes a voter; one change at a time."""
        rep = self._replica(name)
        if node not in self.transport.nodes():
            raise ValidationFailed(f"{node} is not a node of this cluster")
        if node in rep.meta.members:
            raise QueueConflict(f"queue {name} already has a replica on {node}")
        async with self._admit():
            result = await self._route(name, "add_member", (name, node))
        assert isinstance(result, QueueInfo)
        return result

    async def remove_member(self, name: str, node: str) -> QueueInfo:
        """Remove the queue's replica on ``node`` (``DELETE /queues/{name}/members/{node}``)."""
        rep = self._replica(name)
        if node not in rep.meta.members:
            raise QueueNotFound(f"queue {name} has no replica on {node}")
        if len(rep.meta.members) == 1:
            raise QueueConflict(f"queue {name} has one replica: delete the queue instead")
        async with self._admit():
            result = await self._route(name, "remove_member", (name, node))
        assert isinstance(result, QueueInfo)
        return result

    async def _add_member_local(self, rep: Replica, node: str) -> QueueInfo:
        joining = rep.meta
        await self.transport.call(NodeName(node), "create_replica", (joining,))
        await self._change(rep, AddServer(self._request_id(rep), server_id(node, rep.uid)))
        return _info(rep.meta)

    async def _remove_member_local(self, rep: Replica, node: str) -> QueueInfo:
        await self._change(rep, RemoveServer(self._request_id(rep), server_id(node, rep.uid)))
        info = _info(rep.meta)
        if node == self.name:
            await self._delete_replica(rep.uid)
        else:
            with contextlib.suppress(NoLeader, QueueNotFound):
                await self.transport.call(NodeName(node), "delete_replica", (rep.uid,))
        return info

    @staticmethod
    def _request_id(rep: Replica) -> int:
        request_id = rep.next_request_id
        rep.next_request_id += 1
        return request_id

    async def _change(self, rep: Replica, event: AddServer | RemoveServer) -> None:
        """Step a membership change and wait until its entry commits."""
        future: asyncio.Future[object] = self._need_loop().create_future()
        rep.proposals[event.request_id] = Proposal(future, None)
        self._tick(rep)
        rep.raft.step(event)
        self._schedule(rep)
        try:
            await asyncio.wait_for(future, self.limits.proposal_timeout_ms / 1000)
        except TimeoutError:
            raise NoLeader(f"queue {rep.name}: membership change timed out") from None
        finally:
            rep.proposals.pop(event.request_id, None)

    # === leadership ==================================================================

    async def transfer_leadership(self, name: str, node: str) -> None:
        """Hand the queue's leadership to its replica on ``node`` (``POST
        /queues/{name}/leader``); returns once that node leads, or raises ``NoLeader``."""
        rep = self._replica(name)
        if node not in rep.meta.members:
            raise ValidationFailed(f"queue {name} has no replica on {node}")
        async with self._admit():
            await self._route(name, "transfer", (name, node))
        loop = self._need_loop()
        deadline = loop.time() + self.limits.leader_wait_ms / 1000
        while rep.raft.leader is None or node_of(rep.raft.leader) != node:
            if loop.time() > deadline or rep.closed:
                raise NoLeader(f"queue {name}: {node} did not take over in time, retry")
            await asyncio.sleep(0.01)

    async def _transfer_local(self, rep: Replica, node: str) -> None:
        if node == self.name:
            return
        request_id = rep.next_request_id
        rep.next_request_id += 1
        future: asyncio.Future[object] = self._need_loop().create_future()
        rep.proposals[request_id] = Proposal(future, None)
        self._tick(rep)
        rep.raft.step(TransferLeadership(request_id, server_id(node, rep.uid)))
        self._schedule(rep)
        try:
            await asyncio.wait_for(future, self.limits.leader_wait_ms / 1000)
        except TimeoutError:
            raise NoLeader(f"queue {rep.name}: transfer to {node} timed out") from None
        finally:
            rep.proposals.pop(request_id, None)

    # === dead-lettering ==============================================================

    async def _dead_letter(self, rep: Replica, effect: DeadLetter) -> None:
        """Publish copies to the target (dedup ids make a repeat harmless), then confirm.
        A target that exists nowhere in the cluster drops them (the machine's rule)."""
        try:
            copies = self._dead_letter_copies(rep, effect)
            if effect.target != rep.name:
                for batch in self._batches_of(copies):
                    if not await self._publish_anywhere(effect.target, batch):
                        break
            refs = list(effect.refs)
            for k in range(0, len(refs), 60_000):
                await self._propose(rep, encode_dead_letter_confirm(refs[k : k + 60_000]))
        except QuorraError as e:
            log.warning("queue %s: dead-lettering to %s postponed: %s", rep.name, effect.target, e)

    async def _publish_anywhere(self, name: str, batch: list[OutgoingMessage]) -> bool:
        """Publish to ``name`` here, or through a peer that hosts it; False if no node
        has such a queue."""
        if name in self._replicas:
            await self.publish(name, batch)
            return True
        for node in self.transport.nodes():
            if node != self.name:
                try:
                    await self.transport.call(node, "publish_routed", (name, batch))
                    return True
                except QueueNotFound:
                    continue
        return False

    def _batches_of(self, copies: list[OutgoingMessage]) -> list[list[OutgoingMessage]]:
        """Copies in publish batches within the batch limits (count and bytes)."""
        limits = self.limits
        budget = limits.batch_bytes_max // 2  # room for headers and the entry's framing
        out: list[list[OutgoingMessage]] = []
        size = 0
        for m in copies:
            weight = len(m.body) + 256
            if not out or len(out[-1]) >= limits.batch_messages_max or size + weight > budget:
                out.append([])
                size = 0
            out[-1].append(m)
            size += weight
        return out

    def _dead_letter_copies(self, rep: Replica, effect: DeadLetter) -> list[OutgoingMessage]:
        copies = []
        for ref, count in zip(effect.refs, effect.delivery_counts, strict=True):
            parts = rep.machine.ref_parts(ref)
            index, slot = parts.index, parts.slot
            view = read_message(self._entry(rep, index).data, slot)
            headers = decode_headers(view.headers)
            headers.update(
                {
                    "x-death-reason": effect.reason,
                    "x-death-queue": rep.name,
                    "x-delivery-count": str(count),
                }
            )
            copies.append(
                OutgoingMessage(
                    body=bytes(view.body),
                    headers=headers,
                    priority=view.priority,
                    dedup_id=f"dlx:{rep.uid}:{message_id(index, slot)}",
                )
            )
        return copies

    # === checkpoints and compaction ==================================================

    async def _auto_checkpoint(
        self, rep: Replica, cp: Captured | None, release_index: int | None
    ) -> None:
        try:
            async with rep.disk_lock:
                if cp is not None:
                    record = await self._write_checkpoint(rep, cp, "auto")
                    await self._notify(record)
                if cp is not None or release_index is not None:
                    # Compaction runs after each checkpoint (and when the machine releases
                    # its prefix): promote the newest checkpoint, then the phases, cheapest
                    # first, until dead entries are within the configured ratio.
                    compaction = await self._compact_locked(rep, "auto", "auto")
                    if compaction.phase != "none":
                        await self._notify(compaction)
        except (StorageFailed, OSError) as e:
            log.error("queue %s: checkpoint failed: %s", rep.name, e)

    async def _write_checkpoint(
        self, rep: Replica, cp: Captured, trigger: Trigger
    ) -> CheckpointRecord:
        storage = self._need_storage()
        started = time.perf_counter()
        taken_at = self.clock.wall_ms()
        async with self._job():
            job = storage.prepare_checkpoint(rep.uid)
            try:
                live_entries = await self._in_worker(_write_checkpoint, job, cp)
            finally:
                storage.finish_checkpoint(job)
        size = job.bytes
        if cp.index >= rep.checkpoint.index:
            rep.checkpoint = CheckpointInfo(cp.index, taken_at, size)
        return CheckpointRecord(
            queue=rep.name,
            index=cp.index,
            term=cp.term,
            taken_at_ms=taken_at,
            bytes=size,
            live_entries=live_entries,
            trigger=trigger,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    async def _notify(self, record: CheckpointRecord | CompactionRecord) -> None:
        if self._listener is None:
            return
        try:
            await self._listener(record)
        except Exception:  # the listener belongs to the app; its failure is not ours
            log.exception("record listener failed")

    async def checkpoint(self, name: str, *, trigger: Trigger = "manual") -> CheckpointRecord:
        rep = self._replica(name)
        if rep.failed is not None:
            raise rep.failed
        if rep.applied_index == 0 or rep.applied_term == 0:
            raise NoLeader(f"queue {name}: nothing applied yet, retry")
        async with self._admit():
            cp = self._capture(rep, rep.applied_index, rep.applied_term)
            async with rep.disk_lock:
                record = await self._write_checkpoint(rep, cp, trigger)
        if trigger == "auto":
            await self._notify(record)
        return record

    async def compact(
        self, name: str, *, phase: CompactionPhase = "auto", trigger: Trigger = "manual"
    ) -> CompactionRecord:
        """Storage compaction (``engine.storage.compaction``): ``auto`` and 1 first make
        the newest checkpoint the snapshot. Planned and applied on the loop, its I/O in
        a worker; ``phase`` of the record lists the phases that ran ("none" if none)."""
        rep = self._replica(name)
        if phase not in ("auto", 1, 2, 3):
            raise ValidationFailed("phase is auto, 1, 2 or 3")
        async with self._admit(), rep.disk_lock:
            return await self._compact_locked(rep, phase, trigger)

    async def _compact_locked(
        self, rep: Replica, phase: CompactionPhase, trigger: Trigger
    ) -> CompactionRecord:
        """One compaction run; the caller holds ``rep.disk_lock``."""
        storage = self._need_storage()
        started_ms, before = self.clock.wall_ms(), observe.segment_totals(rep)
        async with self._job():
            job = storage.prepare_compaction(rep.uid, phase)
            await self._in_worker(job.run)
            result = storage.finish_compaction(job)
        ran = ",".join(str(p) for p in result.phases) or "none"
        duration_ms = result.duration_s * 1000
        return observe.compaction_record(rep, ran, trigger, started_ms, duration_ms, before)

    # === observation =================================================================

    def stats(self, name: str) -> dict[str, object]:
        failed = self._failed.get(name)
        if failed is not None:
            return observe.failed_stats(failed[1])
        return observe.queue_stats(self._replica(name), self.clock.monotonic_ms())

    def segments(self, name: str) -> list[SegmentInfo]:
        rep = self._replica(name)
        return observe.segment_infos(rep, observe.live_indexes(rep))

    def cluster(self) -> dict[str, object]:
        now = self.clock.monotonic_ms()
        alive_ms = 2 * self.limits.election_timeout_ms_max
        nodes = []
        for node in self.transport.nodes():
            led = sorted(
                rep.name
                for rep in self._replicas.values()
                if rep.raft.leader is not None and node_of(rep.raft.leader) == node
            )
            if node == self.name:
                health = "up" if self._running else "down"
            else:
                heard = self._heard_ms.get(node)
                health = "up" if heard is not None and now - heard <= alive_ms else "unknown"
            nodes.append({"name": node, "health": health, "leads": led, "self": node == self.name})
        return {"node": self.name, "nodes": nodes}

    def wal_stats(self) -> WalStats | None:
        return self._storage.wal.stats() if self._storage is not None else None

    # === helpers =====================================================================

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = self._need_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def _job(self) -> Any:
        """Storage work prepared on the loop, run by a worker and finished on the loop:
        ``_shutdown`` closes storage only once every job has finished."""
        done: asyncio.Future[None] = self._need_loop().create_future()
        self._jobs.add(done)
        try:
            yield
        finally:
            self._jobs.discard(done)
            done.set_result(None)

    async def _in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread. A caller cancelled meanwhile still waits
        for the worker, so that what it does next on the loop (finish a job, close
        storage) comes after the worker's I/O."""
        worker = self._need_loop().run_in_executor(None, functools.partial(fn, *args))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            await asyncio.wait([worker])
            raise

    def _need_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "Node.start first"
        return self._loop

    def _need_storage(self) -> NodeStorage:
        assert self._storage is not None, "Node.start first"
        return self._storage


class ReplicaIo:
    """The server's side of one replica's driver (``engine.runtime.driver.ReplicaHost``):
    writes go to the shared WAL, messages to the transport, applied entries resolve
    proposals and run effects on the node."""

    __slots__ = ("node", "rep")

    def __init__(self, node: Node, rep: Replica) -> None:
        self.node = node
        self.rep = rep

    def on_ready(self, rd: Ready) -> None:
        pass

    def write_hard_state(self, hs: RaftHardState) -> None:
        rep = self.rep
        self.node._submit(rep, HardStateOp(rep.uid, HardState(hs.term, hs.vote, hs.commit)))

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        self.node._install(self.rep, snapshot, given)

    def append_entries(self, entries: list[Entry]) -> None:
        rep = self.rep
        self.node._submit(rep, AppendOp(rep.uid, tuple(entries)))

    def writes_queued(self) -> None:
        writer = self.node._writer
        assert writer is not None
        writer.wake()

    def send(self, message: Message) -> None:
        self.node._send(self.rep, message)

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        self.node._applied(self.rep, entry, reply, effects)

    def passed(self, entry: Entry) -> None:
        self.node._passed(self.rep, entry)

    def accepted(self, accepted: Accepted) -> None:
        p = self.rep.proposals.pop(accepted.request_id, None)
        if p is not None and not p.future.done():
            p.term, p.index = accepted.term, accepted.last_index
            self.rep.waiting[accepted.last_index] = p

    def rejected(self, rejected: RaftRejected) -> None:
        self.node._on_rejected(self.rep, rejected)

    def completed(self, completed: Completed) -> None:
        p = self.rep.proposals.pop(completed.request_id, None)
        if p is not None and not p.future.done():
            p.future.set_result(None)

    def read_ready(self, read: ReadReady) -> None:
        pass  # the node proposes; it asks for no ReadIndex

    def repaired(self) -> None:
        self.node._need_storage().finish_repair(self.rep.uid)
        log.info("queue %s: repaired", self.rep.name)


@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """A checkpoint taken on the loop but not yet encoded: ``build`` copies the ready
    refs out of the frozen pages, off the event loop (``QueueMachine.freeze``)."""

    index: int
    term: int
    machine_version: int
    config: bytes
    frozen: FrozenMachine

    def build(self) -> Checkpoint:
        live, state = self.frozen.live_indexes(), self.frozen.encode()
        return Checkpoint(self.index, self.term, self.machine_version, self.config, live, state)


def _write_checkpoint(job: CheckpointWrite, captured: Captured) -> int:
    """On a worker: encode and write (touches no storage object); the live entries."""
    cp = captured.build()
    job.write(cp)
    return len(cp.live_indexes)


def _close_storage(storage: NodeStorage) -> None:
    """On a worker, which owns the storage from here on (the loop waits for it)."""
    storage.take_over()
    storage.close()


def _info(meta: QueueMeta) -> QueueInfo:
    return QueueInfo(meta.name, meta.uid, meta.args, meta.created_at_ms)


def _implements_the_protocol(node: Node) -> QueueEngine:
    """Checked by mypy: ``Node`` is a ``QueueEngine``."""
    return node


__all__ = ["Node"]
