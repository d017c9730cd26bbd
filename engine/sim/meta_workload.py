"""A cluster metadata workload for the simulator: ``MetaMachine`` on every server, clients
creating and deleting the same few queue names through different servers and now and
then moving a replica (adding or removing a member), and each server's reconcile loop
creating and dropping its replicas, under the world's crashes, partitions and membership
changes.

Every server is also a node of the metadata (its id is its name); the replicas a node
holds are kept apart from the server's simulated storage, as files on its disk would be:
each create or delete of a replica is one atomic step that survives a crash, and a crash
loses the steps of a reconcile pass not yet run (a pass runs its actions one at a time,
a few milliseconds apart). A node reconciles only when its server has applied everything
it knows to be committed, and reports what it did as ``ReplicaCreated``/``ReplicaDropped``
proposals, fire and forget (the next pass reports again what did not commit).

Checked:

* at most one uid per name at a time: the uids of one name, in the order they were
  created, each created after the previous one became a tombstone (a queue replaced
  while not a tombstone is never seen as one);
* every acknowledged create stays visible: every server that applied the entry that
  acknowledged it knows the uid, under that name, at every later index (until a new
  queue of that name replaces its tombstone);
* every server's machine passes ``check_invariants``, and servers that applied the same
  index hold the same state (compared every few indexes);
* at the end, every node's loop, run against the most advanced metadata with what each
  node holds, finishes every create and every delete, and leaves each node holding
  exactly the replicas placed on it.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from engine.cluster import MetaMachine, QueueCreated, QueueExists, encode_command
from engine.cluster import meta_commands as mc
from engine.cluster.reconcile import (
    Action,
    CreateReplica,
    DeleteReplica,
    LocalState,
    after,
    plan,
    reports,
)
from engine.ids import ServerId
from engine.limits import Limits
from engine.queue import QueuePolicy
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Accepted, ReadReady, Rejected
from engine.raft.state_machine import ApplyMeta, Machine
from engine.sim.run import SeedResult

if TYPE_CHECKING:
    from engine.sim.world import SimNode, World

META_LIMITS = Limits(meta_checkpoint_bytes_min=256, meta_record_bytes_estimate=16)
"""Small, so that checkpoints, compaction and snapshot installs happen in every run."""
NAMES = ("orders", "events")
POLICIES = (QueuePolicy(), QueuePolicy(max_length=100))
RECONCILE_EVERY_MS = 60
STATE_DIGEST_EVERY = 5


@dataclass(slots=True)
class _Request:
    kind: str
    """``setup``, ``create``, ``delete``, ``member`` (add or remove one) or ``report``."""
    client: int
    name: str
    commands: tuple[bytes, ...]
    deadline_ms: int
    server: ServerId | None = None
    request_id: int = 0
    index: int = 0
    term: int = 0


@dataclass(slots=True)
class _Uid:
    """What was seen of one uid on any server."""

    name: str
    created_index: int
    tombstone_index: int = 0


@dataclass(slots=True)
class _Node:
    """One node's replicas (its disk) and its reconcile loop."""

    local: dict[str, LocalState] = field(default_factory=dict)
    busy_epoch: int = -1
    """The server epoch of the pass running now (a crash ends it)."""


class MetaWorkload:
    def __init__(self, rng: random.Random, clients: int = 3, timeout_ms: int = 800) -> None:
        self.rng = rng
        self.clients = clients
        self.timeout_ms = timeout_ms
        self.inflight: dict[int, _Request] = {}
        self.leader_hint: dict[int, ServerId | None] = dict.fromkeys(range(-2, clients))
        """Per client (-1: setup, -2: the reconcile loops); clients disagree, as real ones do."""
        self.next_request = 0
        self.nodes: dict[ServerId, _Node] = {}
        self.acked: list[tuple[str, str, int]] = []
        """(name, uid, index of the entry whose reply acknowledged it)."""
        self.uids: dict[str, _Uid] = {}
        self.digests: dict[int, bytes] = {}
        self.found: list[str] = []
        self.completed = 0
        self.tombstones = 0

    def make_machine(self) -> Machine:
        return MetaMachine(META_LIMITS)

    def start(self, world: World) -> None:
        self.nodes = {sid: _Node() for sid in world.server_ids()}
        self._setup(world)
        for client in range(self.clients):
            self._later(world, partial(self._issue, world, client))
        for sid in world.server_ids():
            world.schedule(self.rng.randint(1, RECONCILE_EVERY_MS), partial(self._tick, world, sid))

    def _later(self, world: World, action: partial[None]) -> None:
        world.schedule(self.rng.randint(1, 40), action)

    # --- clients --------------------------------------------------------------------------

    def _setup(self, world: World) -> None:
        """Bootstrap and add every node (idempotent: repeated until it took)."""
        commands = [mc.Bootstrap("sim")] + [mc.AddNode(s, f"sim:{s}") for s in world.server_ids()]
        encoded = tuple(encode_command(c) for c in commands)
        self._send(world, _Request("setup", -1, "", encoded, world.now_ms + 10 * self.timeout_ms))

    def _issue(self, world: World, client: int) -> None:
        name = self.rng.choice(NAMES)
        roll = self.rng.randrange(6)
        command: mc.MetaCommand | None = None
        kind = "member"
        if roll == 5:
            command = self._member_change(world, client, name)
        if command is None and roll >= 2:
            replicas = self.rng.randint(1, len(self.nodes))
            command = mc.CreateQueue(name, replicas, self.rng.choice(POLICIES))
            kind = "create"
        elif command is None:
            command, kind = mc.DeleteQueue(name), "delete"
        deadline = world.now_ms + 4 * self.timeout_ms
        self._send(world, _Request(kind, client, name, (encode_command(command),), deadline))

    def _member_change(self, world: World, client: int, name: str) -> mc.MetaCommand | None:
        """Add or remove a member of ``name`` as some server sees it (perhaps stale: the
        generation refuses a change computed from an old view)."""
        sid = self.leader_hint[client] or self.rng.choice(world.server_ids())
        machine = world.nodes[sid].machine
        assert isinstance(machine, MetaMachine)
        q = machine.queues.get(name)
        if q is None or q.state not in ("creating", "live"):
            return None
        others = [n for n in sorted(self.nodes) if n not in q.members]
        if others and (len(q.members) == 1 or self.rng.randrange(2)):
            return mc.AddMember(q.uid, self.rng.choice(others), q.generation)
        return mc.RemoveMember(q.uid, self.rng.choice(q.members), q.generation)

    def _send(self, world: World, req: _Request) -> None:
        if world.now_ms >= req.deadline_ms:
            self._next(world, req)
            return
        self.next_request += 1
        req.request_id = self.next_request
        req.index = req.term = 0
        self.inflight[req.request_id] = req
        server = req.server if req.kind == "report" else self.leader_hint[req.client]
        server = server or self.rng.choice(world.server_ids())
        req.server = server
        rid = req.request_id
        world.schedule(self.timeout_ms, lambda: self._timeout(world, rid))
        world.propose(server, rid, req.commands)

    def _timeout(self, world: World, request_id: int) -> None:
        req = self.inflight.pop(request_id, None)
        if req is not None:
            self.leader_hint[req.client] = None
            self._retry(world, req)

    def _retry(self, world: World, req: _Request) -> None:
        """Creates and deletes are idempotent and a member change names its generation:
        an unknown outcome is retried; a report is made again by the next reconcile pass."""
        if req.kind != "report":
            world.schedule(self.rng.randint(5, 40), lambda: self._send(world, req))

    def _next(self, world: World, req: _Request) -> None:
        if req.kind in ("create", "delete", "member"):
            self._later(world, partial(self._issue, world, req.client))
        elif req.kind == "setup":
            self._setup(world)

    def on_accepted(self, world: World, node: SimNode, accepted: Accepted) -> None:
        req = self.inflight.get(accepted.request_id)
        if req is not None:
            req.index, req.term = accepted.last_index, accepted.term

    def on_rejected(self, world: World, node: SimNode, rejected: Rejected) -> None:
        req = self.inflight.pop(rejected.request_id, None)
        if req is None:
            return
        hint = rejected.leader if rejected.leader != node.id else None
        self.leader_hint[req.client] = hint
        if req.kind == "report" and hint is not None and req.server == node.id:
            req.server = hint  # the node forwards its report to the leader, once
            self._send(world, req)
        else:
            self._retry(world, req)

    def on_read(self, world: World, node: SimNode, read: ReadReady) -> None:
        pass

    def on_crash(self, world: World, node: SimNode) -> None:
        for rid, req in list(self.inflight.items()):
            if req.server == node.id:
                del self.inflight[rid]
                self._retry(world, req)

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        if entry.kind is not EntryKind.COMMAND:
            return
        machine = node.machine
        assert isinstance(machine, MetaMachine)
        self._check(world, node, machine, entry.index)
        for rid, req in list(self.inflight.items()):
            if req.server != node.id or req.index != entry.index:
                continue
            del self.inflight[rid]
            if req.term != entry.term:
                self._retry(world, req)
                continue
            self.leader_hint[req.client] = node.id
            self._done(world, req, entry, reply)

    def _done(self, world: World, req: _Request, entry: Entry, reply: object) -> None:
        if req.kind in ("create", "delete", "member"):
            self.completed += 1
        if isinstance(reply, QueueCreated | QueueExists) and req.kind == "create":
            self.acked.append((req.name, reply.uid, entry.index))
        if req.kind == "setup":
            return  # its last command applied: every node is known
        self._next(world, req)

    # --- reconcile loops -----------------------------------------------------------------

    def _tick(self, world: World, sid: ServerId) -> None:
        world.schedule(RECONCILE_EVERY_MS, partial(self._tick, world, sid))
        sim_node = world.nodes[sid]
        state = self.nodes[sid]
        raft = sim_node.raft
        if not sim_node.alive or state.busy_epoch == sim_node.epoch or raft.applied < raft.commit:
            return
        machine = sim_node.machine
        assert isinstance(machine, MetaMachine)
        actions = plan(sid, machine.hosted_by(sid), state.local)
        if actions:
            state.busy_epoch = sim_node.epoch
            self._run(world, sid, sim_node.epoch, actions, 0)

    def _run(self, world: World, sid: ServerId, epoch: int, actions: list[Action], k: int) -> None:
        """Run ``actions[k]`` (one atomic step on the node's disk), then the next one a
        little later; a crash in between loses the rest of the pass."""
        sim_node, state = world.nodes[sid], self.nodes[sid]
        if not sim_node.alive or sim_node.epoch != epoch:
            return
        if k == len(actions):
            state.busy_epoch = -1
            return
        action = actions[k]
        if isinstance(action, CreateReplica | DeleteReplica):
            state.local = after(state.local, [action])
            world.log(f"{sid} {type(action).__name__} {action.uid}")
        for command in reports(sid, [action]):
            deadline = world.now_ms + self.timeout_ms
            req = _Request("report", -2, "", (encode_command(command),), deadline, server=sid)
            self._send(world, req)
        delay = self.rng.randint(1, 15)
        world.schedule(delay, lambda: self._run(world, sid, epoch, actions, k + 1))

    # --- checks ---------------------------------------------------------------------------

    def _fail(self, world: World, text: str) -> None:
        if len(self.found) < 10:
            self.found.append(f"t={world.now_ms} meta: {text}")

    def _check(self, world: World, node: SimNode, machine: MetaMachine, index: int) -> None:
        try:
            machine.check_invariants()
        except AssertionError as exc:
            self._fail(world, f"{node.id} at {index}: invariant broken: {exc}")
        for q in machine.queues.values():
            seen = self.uids.setdefault(q.uid, _Uid(q.name, q.created_index))
            if (seen.name, seen.created_index) != (q.name, q.created_index):
                self._fail(world, f"uid {q.uid} is {q.name}@{q.created_index} on {node.id}")
            if q.tombstone_index and not seen.tombstone_index:
                seen.tombstone_index = q.tombstone_index
                self.tombstones += 1
        for name, uid, acked_at in self.acked:
            if index >= acked_at and not self._visible(machine, name, uid, index):
                self._fail(world, f"acknowledged {name} ({uid}) unknown to {node.id} at {index}")
        if index % STATE_DIGEST_EVERY == 0 and node.raft.applied == index:
            digest = hashlib.sha256(machine.snapshot()).digest()
            if self.digests.setdefault(index, digest) != digest:
                self._fail(world, f"{node.id} has another metadata state at index {index}")

    def _visible(self, machine: MetaMachine, name: str, uid: str, index: int) -> bool:
        """Whether the machine knows ``uid`` as ``name``, or it was deleted and the name
        taken again since (a new queue replaces the tombstone)."""
        rec = machine.queue_by_uid(uid)
        if rec is not None:
            return rec.name == name
        seen = self.uids.get(uid)
        return seen is not None and 0 < seen.tombstone_index <= index

    def violations(self) -> list[str]:
        return list(self.found)

    def finish(self, world: World) -> list[str]:
        self._check_one_uid_at_a_time(world)
        self._check_loops_converge(world)
        return list(self.found)

    def _check_one_uid_at_a_time(self, world: World) -> None:
        by_name: dict[str, list[tuple[int, int, str]]] = {}
        for uid, seen in sorted(self.uids.items()):
            by_name.setdefault(seen.name, []).append(
                (seen.created_index, seen.tombstone_index, uid)
            )
        for name, lives in sorted(by_name.items()):
            lives.sort()
            for (_c, gone_at, uid), (born_at, _t, successor) in itertools.pairwise(lives):
                if not gone_at or born_at <= gone_at:
                    self._fail(world, f"{name}: {successor} created at {born_at} while {uid} lived")

    def _check_loops_converge(self, world: World) -> None:
        """From where the run stopped, every node's loop (two passes each, reports applied
        to a copy of the most advanced metadata) finishes every create and delete."""
        advanced = max(world.nodes.values(), key=lambda n: n.raft.applied)
        machine = MetaMachine(META_LIMITS)
        machine.restore(advanced.machine.snapshot())
        if not machine.cluster_id:
            return
        index = machine.last_index
        local = {sid: dict(state.local) for sid, state in sorted(self.nodes.items())}
        for _round in range(2):
            for sid in sorted(local):
                actions = plan(sid, machine.hosted_by(sid), local[sid])
                local[sid] = after(local[sid], actions)
                for command in reports(sid, actions):
                    index += 1
                    machine.apply(ApplyMeta(index, 0, 0), encode_command(command))
        for q in sorted(machine.queues.values(), key=lambda q: q.name):
            if q.state not in ("live", "tombstone"):
                self._fail(world, f"{q.name} ({q.uid}) stuck {q.state} with every node reconciling")
        for sid, held in sorted(local.items()):
            want = {uid for uid, q in machine.hosted_by(sid).items() if q.state != "deleting"}
            if set(held) != want:
                self._fail(world, f"{sid} holds {sorted(held)} once reconciled, not {sorted(want)}")


def run_meta_seed(seed: int, steps: int = 3000, servers: int = 3) -> SeedResult:
    """Run one seed of the metadata workload on a simulated cluster."""
    from engine.sim.world import SimConfig, World

    started = time.perf_counter()
    made: list[MetaWorkload] = []

    def factory(rng: random.Random) -> MetaWorkload:
        made.append(MetaWorkload(rng))
        return made[-1]

    world = World(SimConfig(seed=seed, servers=servers, steps=steps), workload_factory=factory)
    violations = world.run()
    return SeedResult.of(seed, world, violations, made[0].completed, started)


__all__ = ["MetaWorkload", "run_meta_seed"]
