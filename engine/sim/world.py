"""The simulated cluster: servers, a virtual clock, the network and disks.

One ``random.Random(seed)`` decides everything, and nothing iterates an unordered
collection, so the same seed gives the same run byte for byte (``World.trace_digest``).
Each server runs the runtime's ``ReplicaDriver``; the world is its host (``_Host``):
writes go to the server's simulated storage and become durable at the next simulated
sync, messages go through the simulated network. The faults are the ``Nemesis``'s
(``engine.sim.faults``).

Plug points: ``storage_factory`` (any ``SimStorage``), the ``Workload`` (machine, clients,
final checks) and extra ``Observer`` checkers.

Damaged disks (``SimConfig.corrupt_disks``): a read that meets damaged data while running
(``EntryDamaged``) records the repair and crashes the server, which restarts in repair
mode. At the end the faults stop, the network heals and the run goes on until every
member has left repair and applied the same state as the leader; a member still
repairing, or different, is a violation.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import EntryDamaged
from engine.ids import ServerId
from engine.limits import Limits
from engine.raft.config import Configuration
from engine.raft.entry import Entry
from engine.raft.events import (
    Accepted,
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
    SnapshotInstalled,
    SnapshotTaken,
    Tick,
)
from engine.raft.messages import Message
from engine.raft.server import Fault, RaftOptions, RaftServer, Role
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import CheckpointRequest, Machine, MachineEffect
from engine.runtime.driver import ReplicaDriver
from engine.sim.checkers import DurableBeforePromised, Observer, RaftSafety, TermsNeverBack
from engine.sim.faults import Nemesis
from engine.sim.network import Network, NetworkFaults
from engine.sim.storage import MemStorage, SimStorage
from engine.sim.workload import KvWorkload, Workload

StorageFactory = Callable[[ServerId], SimStorage]
WorkloadFactory = Callable[[random.Random], Workload]


@dataclass(frozen=True, slots=True)
class SimConfig:
    seed: int
    servers: int = 3
    steps: int = 3000
    fault: Fault = Fault.NONE
    crashes: bool = True
    partitions: bool = True
    membership: bool = True
    transfers: bool = True
    tear_writes: bool = True
    corrupt_disks: bool = False
    settle_steps_max: int = 30_000
    """With ``corrupt_disks``: events allowed at the end for every member to be repaired."""
    sleeps: bool = False
    """A lone server that leads with everything durable and applied is now and then
    rebuilt from its storage and leads again in its term without an election, as a
    sleeping queue wakes (``RaftServer.resume_as_sole_leader``); one server only."""

    def __post_init__(self) -> None:
        assert self.servers in (1, 3, 5) and self.steps >= 1
        assert not self.sleeps or self.servers == 1, "only a lone voter sleeps"


@dataclass
class SimNode:
    id: ServerId
    storage: SimStorage
    rng: random.Random
    snapshot_every: int
    alive: bool = True
    epoch: int = 0
    sync_scheduled: bool = False
    writing: list[Event | None] = field(default_factory=list)
    """What the core learns as each queued write becomes durable, in order."""
    snapshot_index: int = 0
    seen_role: tuple[int, int] = (-1, -1)
    driver: ReplicaDriver[Machine] = field(init=False)

    @property
    def raft(self) -> RaftServer:
        return self.driver.raft

    @property
    def machine(self) -> Machine:
        return self.driver.machine


def _sim_limits(rng: random.Random) -> Limits:
    """Small, random bounds so flow control, batching and chunking are all exercised."""
    append_bytes = rng.choice([64, 256, 4096])
    return Limits(
        append_entries_per_message_max=rng.randint(1, 8),
        append_bytes_per_message_max=append_bytes,
        inflight_messages_per_follower_max=rng.randint(1, 4),
        inflight_bytes_per_follower_max=append_bytes * rng.randint(1, 8),
        snapshot_chunk_bytes=rng.choice([32, 128, 1024]),
        uncommitted_bytes_max=rng.choice([512, 1 << 20]),
    )


class World:
    def __init__(
        self,
        config: SimConfig,
        workload_factory: WorkloadFactory | None = None,
        storage_factory: StorageFactory | None = None,
        observers: list[Observer] | None = None,
        keep_trace: bool = False,
    ) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.now_ms = 0
        self.steps = 0
        self.limits = _sim_limits(self.rng)
        faults = NetworkFaults(
            delay_ms_min=1,
            delay_ms_max=self.rng.choice([2, 10, 40]),
            drop_per_mille=self.rng.choice([0, 10, 50, 150]),
            duplicate_per_mille=self.rng.choice([0, 10, 50]),
        )
        self.network = Network(self.rng, faults)
        self.disk_ms_max = self.rng.choice([2, 5, 30, 80])
        """A sync takes up to this long: slow disks let followers ack before the leader."""
        self.queue: list[tuple[int, int, Callable[[], None]]] = []
        self.seq = 0
        self.trace: deque[str] = deque(maxlen=30)
        self.full_trace: list[str] | None = [] if keep_trace else None
        self.digest = hashlib.sha256()
        self.safety = RaftSafety()
        self.durability = DurableBeforePromised()
        self.observers: list[Observer] = [self.safety, self.durability, *(observers or [])]
        if not config.corrupt_disks:  # a damaged disk may lose a term it held
            self.observers.append(TermsNeverBack())
        make_workload = workload_factory or (lambda rng: KvWorkload(rng))
        self.workload = make_workload(self.rng)
        self.storage_factory = storage_factory or (lambda _id: MemStorage())
        self.ids = [ServerId(f"s{n + 1}") for n in range(config.servers)]
        self.bootstrap = Configuration(tuple(self.ids))
        self.nodes: dict[ServerId, SimNode] = {}
        self.errors: list[str] = []
        self.nemesis = Nemesis(self)
        self.settle_target = 0
        """What was committed when the settling began (see ``_settle``)."""
        for sid in self.ids:
            self.nodes[sid] = self._boot(sid, self.storage_factory(sid))

    # --- public surface for workloads -------------------------------------------------

    def server_ids(self) -> list[ServerId]:
        return list(self.ids)

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def schedule(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (self.now_ms + max(0, delay_ms), self.seq, action))

    def propose(self, server: ServerId, request_id: int, commands: tuple[bytes, ...]) -> None:
        self._client_event(server, Propose(request_id, commands), request_id)

    def read(self, server: ServerId, request_id: int) -> None:
        self._client_event(server, ReadIndex(request_id), request_id)

    def log(self, text: str) -> None:
        line = f"t={self.now_ms} {text}"
        self.trace.append(line)
        self.digest.update(line.encode() + b"\n")
        if self.full_trace is not None:
            self.full_trace.append(line)

    def trace_digest(self) -> str:
        return self.digest.hexdigest()

    # --- running ----------------------------------------------------------------------

    def run(self) -> list[str]:
        """Run ``config.steps`` events; returns the violations found (empty: passed)."""
        self.workload.start(self)
        self.schedule(self.limits.tick_ms, self._tick)
        self.nemesis.start()
        self._run_until(self.config.steps, lambda: False)
        if self.config.corrupt_disks and not self.errors and not self.safety.found:
            self._settle()
        found = list(self.errors)
        for obs in self.observers:
            found.extend(obs.violations())
        if not found:
            found.extend(self.workload.finish(self))
        for node in self.nodes.values():
            raft = node.raft
            state = hashlib.sha256(node.machine.snapshot()).hexdigest()[:16]
            self.log(
                f"final {node.id} alive={node.alive} {raft.role.name.lower()} term={raft.term} "
                f"commit={raft.commit} applied={raft.applied} last={raft.log.last_index()} "
                f"machine={state}"
            )
        self.log(f"end steps={self.steps} violations={len(found)}")
        return found

    def _run_until(self, steps_max: int, done: Callable[[], bool]) -> None:
        stepping = [
            obs for obs in self.observers if type(obs).after_step is not Observer.after_step
        ]
        while self.steps < steps_max and not self.errors and not done():
            when, _seq, action = heapq.heappop(self.queue)
            self.now_ms = when
            self.steps += 1
            try:
                action()
            except AssertionError as exc:
                self.errors.append(f"t={self.now_ms} assertion failed: {exc}")
                break
            for obs in stepping:
                obs.after_step(self)
            if self.safety.found:
                break

    def _settle(self) -> None:
        """Stop the faults and run until every member is repaired and caught up."""
        self.nemesis.stop()
        self.network.heal()
        self.log("settle")
        self.settle_target = max(n.raft.commit for n in self.nodes.values())
        self._run_until(self.steps + self.config.settle_steps_max, self._settled)
        if self.errors or self.safety.found:
            return
        leader = self.leader()
        if leader is None or not self._caught_up(leader):
            states = [
                f"{n.id} alive={n.alive} repairing={n.raft.repairing} applied={n.raft.applied}"
                for n in self.nodes.values()
            ]
            self.errors.append(f"t={self.now_ms} repair: the cluster did not settle: {states}")
            return
        digest = hashlib.sha256(leader.machine.snapshot()).digest()
        for sid in leader.raft.config.members:
            node = self.nodes[sid]
            same = node.raft.applied == leader.raft.applied
            if same and hashlib.sha256(node.machine.snapshot()).digest() != digest:
                self.errors.append(f"t={self.now_ms} repair: {sid} applied another state")

    def _settled(self) -> bool:
        """Every member repaired and at the leader's commit index (under a steady load
        this may not happen at one instant: ``_caught_up`` then suffices)."""
        leader = self.leader()
        if leader is None or not self._caught_up(leader):
            return False
        members = leader.raft.config.members
        return all(self.nodes[sid].raft.applied == leader.raft.commit for sid in members)

    def _caught_up(self, leader: SimNode) -> bool:
        """Every member alive, out of repair, and past what was committed when the
        settling began; the leader has committed in its term."""
        if leader.raft.commit < leader.raft.term_start_index:
            return False
        for sid in leader.raft.config.members:
            node = self.nodes[sid]
            raft = node.raft
            if not node.alive or raft.repairing or raft.applied < self.settle_target:
                return False
        return True

    def _tick(self) -> None:
        for node in self.live_nodes():
            try:
                self._maybe_offer_snapshot(node)
            except EntryDamaged as error:
                self._on_damaged(node, error)
                continue
            self.step(node, Tick(self.now_ms))
        self.schedule(self.limits.tick_ms, self._tick)

    def _client_event(self, server: ServerId, event: Event, request_id: int) -> None:
        node = self.nodes[server]
        if not node.alive:
            self.workload.on_rejected(self, node, Rejected(request_id, "unavailable", None))
            return
        self.step(node, event)

    def _deliver(self, msg: Message) -> None:
        node = self.nodes[msg.dst]
        if node.alive and self.network.connected(msg.src, msg.dst):
            self.step(node, Receive(msg))

    def _send(self, msg: Message) -> None:
        for delay in self.network.delays_ms(msg.src, msg.dst):
            self.schedule(delay, lambda m=msg: self._deliver(m))  # type: ignore[misc]

    # --- the replica driver's host -----------------------------------------------------

    def step(self, node: SimNode, event: Event) -> None:
        """The server takes ``event`` and its driver acts on what that made ready."""
        if not node.alive:
            return
        try:
            node.raft.step(event)
            node.raft.check_invariants()
            self._drain(node)
        except EntryDamaged as error:
            self._on_damaged(node, error)

    def _on_damaged(self, node: SimNode, error: EntryDamaged) -> None:
        """A read met damaged data: record the repair, crash, restart in repair mode."""
        self.log(f"{node.id} read damaged data: {error.detail}")
        node.storage.mark_damaged(error)
        self.crash(node.id)
        self.schedule(self.rng.randint(1, 50), lambda: self.restart(node.id))

    def _drain(self, node: SimNode) -> None:
        """The driver acts on every ``Ready``; a size-triggered snapshot may make more."""
        while True:
            node.driver.process()
            if not self._maybe_snapshot(node):
                break
        role = (int(node.raft.role), node.raft.term)
        if role != node.seen_role:
            node.seen_role = role
            self.log(f"{node.id} {node.raft.role.name.lower()} term={node.raft.term}")
            for obs in self.observers:
                obs.on_role(self, node)

    def _sync(self, node: SimNode, epoch: int) -> None:
        """The disk made every queued write durable: the driver learns of each in turn."""
        if not node.alive or node.epoch != epoch:
            return
        node.sync_scheduled = False
        node.storage.sync()
        done, node.writing = node.writing, []
        try:
            node.driver.written_all(done)
            node.raft.check_invariants()
            self._drain(node)
        except EntryDamaged as error:
            self._on_damaged(node, error)

    def _maybe_snapshot(self, node: SimNode) -> bool:
        """Every ``snapshot_every`` applied entries, as a runtime's size trigger would;
        whether one was taken."""
        applied = node.raft.applied
        if applied - node.snapshot_index < node.snapshot_every:
            return False
        term = node.raft.log.term(applied)
        assert term is not None
        self._take_snapshot(node, applied, term)
        return True

    def _take_snapshot(self, node: SimNode, index: int, term: int) -> None:
        """Checkpoint the machine as of ``index`` (just applied) and its live indexes."""
        raft = node.raft
        live = node.machine.live_indexes()
        snap = Snapshot(index, term, raft.config_at(index), node.machine.snapshot(), live)
        node.storage.save_snapshot(snap)
        node.snapshot_index = index
        raft.step(SnapshotTaken(snap))

    def _maybe_offer_snapshot(self, node: SimNode) -> None:
        if node.driver.wants_snapshot(node.storage.snapshot_index()):
            node.driver.offer_snapshot(node.storage.snapshot())

    # --- servers ----------------------------------------------------------------------

    def _boot(self, sid: ServerId, storage: SimStorage) -> SimNode:
        node_rng = random.Random(self.rng.getrandbits(64))
        options = RaftOptions(sid, node_rng, self.limits, fault=self.config.fault)
        hard_state, snapshot = storage.recover()
        machine = self.workload.make_machine()
        meta = None
        if snapshot is not None:
            machine.restore(snapshot.machine_state)
            meta = snapshot.meta
        raft = RaftServer(
            options,
            storage,
            hard_state,
            meta,
            self.bootstrap,
            self.now_ms,
            repair=storage.repairing(),
        )
        every = self.rng.randint(5, 60)
        node = SimNode(sid, storage, node_rng, every)
        node.snapshot_index = snapshot.index if snapshot else 0
        node.driver = ReplicaDriver(
            raft,
            machine,
            _Host(self, node),
            base_index=node.snapshot_index,
            replay_until=storage.last_index(),
            hard_state_written=(0, None)
            if hard_state is None
            else (hard_state.term, hard_state.vote),
            fault=self.config.fault,
        )
        return node

    def crash(self, sid: ServerId) -> None:
        node = self.nodes[sid]
        tear = self.config.tear_writes and self.rng.randrange(2) == 0
        node.alive = False
        node.epoch += 1
        node.storage.crash(self.rng, tear)
        self.log(f"crash {sid}{' (torn write)' if tear else ''}")
        for obs in self.observers:
            obs.on_crash(self, node)
        self.workload.on_crash(self, node)

    def restart(self, sid: ServerId) -> None:
        old = self.nodes[sid]
        node = self._boot(sid, old.storage)
        node.epoch = old.epoch + 1
        self.nodes[sid] = node
        repairing = " repairing" if node.raft.repairing else ""
        self.log(
            f"restart {sid} term={node.raft.term} last={node.raft.log.last_index()}{repairing}"
        )
        try:
            self._drain(node)
        except EntryDamaged as error:
            self._on_damaged(node, error)

    def sleep_and_wake(self, sid: ServerId) -> bool:
        """If ``sid`` leads alone with nothing unwritten, uncommitted, unapplied or
        waiting, rebuild it from its storage (no crash: everything it wrote is durable)
        and have it lead again in its term (``SimConfig.sleeps``). Whether it did."""
        node = self.nodes[sid]
        raft, driver = node.raft, node.driver
        if not node.alive or raft.role is not Role.LEADER or raft.has_ready():
            return False
        last = raft.log.last_index()
        if driver.writes_pending() or node.writing or not raft.reads.is_empty():
            return False
        if raft.commit != last or raft.applied != last or raft.uncommitted:
            return False
        node.alive = False  # the events still addressed to the old one do nothing
        woken = self._boot(sid, node.storage)
        woken.epoch = node.epoch + 1
        self.nodes[sid] = woken
        resumed = woken.raft.resume_as_sole_leader()
        self.log(f"wake {sid} term={woken.raft.term} last={last} resumed={resumed}")
        if not resumed:
            self.errors.append(f"t={self.now_ms} {sid} did not resume its leadership")
        woken.raft.check_invariants()
        self._drain(woken)
        return True

    def leader(self) -> SimNode | None:
        """The live leader of the highest term, if any."""
        leaders = [n for n in self.live_nodes() if n.raft.role is Role.LEADER]
        return max(leaders, key=lambda n: n.raft.term) if leaders else None


class _Host:
    """What the simulator does for one server's driver (``ReplicaHost``): writes go to
    its simulated storage, durable at the next simulated sync; messages to the network."""

    def __init__(self, world: World, node: SimNode) -> None:
        self.world = world
        self.node = node

    def on_ready(self, rd: Ready) -> None:
        for obs in self.world.observers:
            obs.on_ready(self.world, self.node, rd)

    def write_hard_state(self, hs: HardState) -> None:
        self.node.storage.write(hs, None, [])
        self.node.writing.append(None)

    def install_snapshot(self, snapshot: Snapshot, given: list[Entry]) -> None:
        node = self.node
        node.storage.write(None, snapshot, [], given)
        node.writing.append(SnapshotInstalled(snapshot.index, snapshot.term))
        node.snapshot_index = snapshot.index
        self.world.log(f"{node.id} installs snapshot at {snapshot.index}")

    def append_entries(self, entries: list[Entry]) -> None:
        self.node.storage.write(None, None, entries)
        last = entries[-1]
        self.node.writing.append(Persisted(last.index, last.term))

    def writes_queued(self) -> None:
        node, world = self.node, self.world
        if not node.sync_scheduled:
            node.sync_scheduled = True
            epoch = node.epoch
            world.schedule(
                world.rng.randint(0, world.disk_ms_max), lambda: world._sync(node, epoch)
            )

    def send(self, message: Message) -> None:
        for obs in self.world.observers:
            obs.on_send(self.world, self.node, message)
        self.world._send(message)

    def applied(self, entry: Entry, reply: object, effects: list[MachineEffect]) -> None:
        world, node = self.world, self.node
        for effect in effects:
            # Followers and leaders alike checkpoint; other effects are the runtime's.
            if type(effect) is CheckpointRequest and entry.index > node.snapshot_index:
                world._take_snapshot(node, entry.index, entry.term)
        for obs in world.observers:
            obs.on_applied(world, node, entry, reply)
        world.workload.on_applied(world, node, entry, reply)

    def passed(self, entry: Entry) -> None:
        self.applied(entry, None, [])

    def accepted(self, accepted: Accepted) -> None:
        self.world.workload.on_accepted(self.world, self.node, accepted)

    def rejected(self, rejected: Rejected) -> None:
        self.world.workload.on_rejected(self.world, self.node, rejected)

    def completed(self, completed: Completed) -> None:
        self.world.log(
            f"{self.node.id} completed request {completed.request_id} at {completed.index}"
        )

    def read_ready(self, read: ReadReady) -> None:
        self.world.workload.on_read(self.world, self.node, read)

    def repaired(self) -> None:
        node = self.node
        node.storage.finish_repair()
        self.world.log(f"{node.id} repaired term={node.raft.term} vote={node.raft.vote}")


__all__ = ["SimConfig", "SimNode", "StorageFactory", "WorkloadFactory", "World"]
