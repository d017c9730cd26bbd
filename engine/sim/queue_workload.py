"""A queue workload for the simulator: publishers, consumers and a lease timer driving
``QueueMachine`` on every server, and the queue's safety properties checked on the
history they saw.

Publishers send batches (one entry each) with a dedup id per message and retry an
unknown outcome with the same ids, so a retried publish is idempotent. Consumers check
out a few messages, read each body from the log of the server that answered (through
the same path as the runtime: ``ref_parts`` then ``read_message``), then ack, nack with
requeue, ack with their next checkout (one settle-checkout entry, as a receive carrying
acks), or walk away and let the lease expire. A timer proposes the expire command.

Checked: no confirmed message lost (each one published and never sent a settle is still
held by the queue at the end; one whose settle had an unknown outcome may be gone); no settled message delivered again; per priority level, first
deliveries in publish order; the body delivered is the body published; counts equal
contents on every server (``check_invariants``) and every replica's state is the same
at the same index.

With ``page_budget`` every machine pages its ready index (``engine.queue.paging``) to a
page store in memory, keeping that many pages resident besides its heads and tails,
and runs its read-ahead after every step: replicas with other pages in memory must still
agree byte for byte, through crashes and restores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    Delivery,
    Enqueued,
    MemorySpill,
    NewMessage,
    NodePages,
    Paging,
    QueueMachine,
    QueuePolicy,
    Settled,
    SettledCheckedOut,
    encode_checkout,
    encode_enqueue,
    encode_expire,
    encode_return,
    encode_settle,
    encode_settle_checkout,
    message_id,
    read_message,
)
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Accepted, ReadReady, Rejected
from engine.raft.state_machine import Machine
from engine.sim.checkers import Observer
from engine.sim.run import SeedResult

if TYPE_CHECKING:
    from engine.sim.world import SimNode, World

QUEUE_LIMITS = Limits(page_refs=16, enqueue_time_resolution_ms=1)
LEASE_MS = 400
EXPIRE_EVERY_MS = 100
STATE_DIGEST_EVERY = 7


@dataclass(slots=True)
class _Request:
    kind: str
    """``publish``, ``checkout``, ``settle_checkout``, ``settle``, ``return`` or
    ``expire``."""
    client: int
    command: bytes
    deadline_ms: int
    attempts: int = 0
    server: ServerId | None = None
    request_id: int = 0
    index: int = 0
    term: int = 0
    bodies: list[tuple[bytes, int]] = field(default_factory=list)
    """For a publish: (body, priority) of each message."""
    receipts: list[tuple[int, int, int]] = field(default_factory=list)
    """For settle/return/settle_checkout: (tag, ref, message id)."""


class QueueWorkload(Observer):
    def __init__(
        self,
        rng: random.Random,
        publishers: int = 2,
        consumers: int = 2,
        timeout_ms: int = 800,
        priorities: int = 2,
        page_budget: int | None = None,
    ) -> None:
        self.rng = rng
        self.page_budget = page_budget
        self.publishers = publishers
        self.consumers = consumers
        self.timeout_ms = timeout_ms
        self.priorities = priorities
        self.inflight: dict[int, _Request] = {}
        self.leader_hint: ServerId | None = None
        self.next_request = 0
        self.next_body = 0
        self.published: dict[bytes, int] = {}
        """Every body ever sent -> priority."""
        self.confirmed: dict[int, bytes] = {}
        """Message id -> body, for publishes whose reply was seen."""
        self.settled: dict[int, int] = {}
        """Message id -> index of the settle entry that took effect."""
        self.settle_sent: set[int] = set()
        """Message ids some settle was sent for (its outcome may stay unknown)."""
        self.acks_for_next: dict[int, list[tuple[int, int, int]]] = {}
        """Consumer -> receipts its next checkout carries (a settle-checkout)."""
        self.deliveries: list[tuple[int, int, int, int, int]] = []
        """(checkout index, position, priority, message id, delivery count)."""
        self.digests: dict[int, bytes] = {}
        self.found: list[str] = []
        self.completed = 0
        self.steps_seen = 0
        self.last_applied_call: tuple[str, int, int] | None = None

    def make_machine(self) -> Machine:
        policy = QueuePolicy(priorities=self.priorities, lease_ms=LEASE_MS, delivery_limit=None)
        if self.page_budget is None:
            return QueueMachine(policy, QUEUE_LIMITS)
        budget_bytes = self.page_budget * QUEUE_LIMITS.page_refs * 8
        limits = dataclasses.replace(
            QUEUE_LIMITS,
            paged_index_bytes_per_queue_max=budget_bytes,
            paged_index_bytes_per_node_max=budget_bytes,
            page_read_ahead=1,
        )
        paging = Paging(MemorySpill(), NodePages.from_limits(limits))
        return QueueMachine(policy, limits, paging)

    def start(self, world: World) -> None:
        for client in range(self.publishers):
            self._later(world, partial(self._publish, world, client))
        for client in range(self.consumers):
            self._later(world, partial(self._checkout, world, client))
        world.schedule(EXPIRE_EVERY_MS, lambda: self._expire(world))

    def _later(self, world: World, action: Callable[[], None]) -> None:
        world.schedule(self.rng.randint(1, 40), action)

    # --- client actions ----------------------------------------------------------------

    def _publish(self, world: World, client: int) -> None:
        batch: list[tuple[bytes, int]] = []
        for _ in range(self.rng.randint(1, 4)):
            self.next_body += 1
            body = f"p{client}-{self.next_body}".encode()
            priority = self.rng.randrange(self.priorities)
            self.published[body] = priority
            batch.append((body, priority))
        messages = [NewMessage(body, priority=p, dedup_id=body) for body, p in batch]
        req = _Request("publish", client, encode_enqueue(messages), world.now_ms + 4000)
        req.bodies = batch
        self._send(world, req)

    def _checkout(self, world: World, client: int) -> None:
        consumer, n = f"c{client}", self.rng.randint(1, 4)
        acks = self.acks_for_next.pop(client, [])
        deadline_ms = world.now_ms + self.timeout_ms
        if not acks:
            self._send(
                world, _Request("checkout", client, encode_checkout(consumer, n), deadline_ms)
            )
            return
        pairs = [(tag, ref) for tag, ref, _mid in acks]
        command = encode_settle_checkout(pairs, consumer, n)
        req = _Request("settle_checkout", client, command, deadline_ms)
        req.receipts = acks
        self._send(world, req)

    def _expire(self, world: World) -> None:
        world.schedule(EXPIRE_EVERY_MS, lambda: self._expire(world))
        req = _Request("expire", -1, encode_expire(), world.now_ms + EXPIRE_EVERY_MS)
        self._send(world, req)

    def _send(self, world: World, req: _Request) -> None:
        if world.now_ms >= req.deadline_ms:
            self._give_up(world, req)
            return
        self.next_request += 1
        req.request_id = self.next_request
        req.attempts += 1
        req.index = req.term = 0
        self.inflight[req.request_id] = req
        server = self.leader_hint or self.rng.choice(world.server_ids())
        req.server = server
        rid = req.request_id
        world.schedule(self.timeout_ms, lambda: self._timeout(world, rid))
        world.propose(server, rid, (req.command,))

    def _timeout(self, world: World, request_id: int) -> None:
        req = self.inflight.pop(request_id, None)
        if req is not None:
            self.leader_hint = None
            self._retry_or_give_up(world, req)

    def _retry_or_give_up(self, world: World, req: _Request) -> None:
        """Publishes are retried with the same dedup ids; other requests give up (a lost
        checkout leaves leases that expire; a lost ack lets the message come back)."""
        if req.kind == "publish":
            world.schedule(self.rng.randint(5, 40), lambda: self._send(world, req))
        else:
            self._give_up(world, req)

    def _give_up(self, world: World, req: _Request) -> None:
        self._next(world, req)

    def _next(self, world: World, req: _Request) -> None:
        if req.kind == "publish":
            self._later(world, lambda: self._publish(world, req.client))
        elif req.kind in ("checkout", "settle_checkout"):
            self._later(world, lambda: self._checkout(world, req.client))

    # --- answers from servers ------------------------------------------------------------

    def on_accepted(self, world: World, node: SimNode, accepted: Accepted) -> None:
        req = self.inflight.get(accepted.request_id)
        if req is not None:
            req.index, req.term = accepted.last_index, accepted.term

    def on_rejected(self, world: World, node: SimNode, rejected: Rejected) -> None:
        req = self.inflight.pop(rejected.request_id, None)
        if req is None:
            return
        self.leader_hint = rejected.leader if rejected.leader != node.id else None
        if req.kind == "publish" or rejected.reason != "lost_leadership":
            retry_ms = self.rng.randint(5, 40)
            world.schedule(retry_ms, lambda: self._send(world, req))
        else:
            self._give_up(world, req)

    def on_read(self, world: World, node: SimNode, read: ReadReady) -> None:
        pass

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        key = (node.id, node.epoch, entry.index)
        if key == self.last_applied_call:
            return  # told twice: as the workload and as an observer
        self.last_applied_call = key
        if entry.index % STATE_DIGEST_EVERY == 0:
            self._check_same_state(world, node, entry.index)
        if entry.kind is not EntryKind.COMMAND:
            return
        for rid, req in list(self.inflight.items()):
            if req.server != node.id or req.index != entry.index:
                continue
            del self.inflight[rid]
            if req.term != entry.term:
                self._retry_or_give_up(world, req)
                continue
            self.leader_hint = node.id
            self.completed += 1
            self._on_done(world, node, entry, req, reply)

    def _on_done(
        self, world: World, node: SimNode, entry: Entry, req: _Request, reply: object
    ) -> None:
        if req.kind == "publish":
            assert isinstance(reply, Enqueued), reply
            for (body, _priority), mid in zip(req.bodies, reply.ids, strict=True):
                known = self.confirmed.setdefault(mid, body)
                if known != body:
                    self._fail(world, f"publish of {body!r} confirmed as id {mid} of {known!r}")
        elif req.kind == "checkout":
            assert isinstance(reply, CheckedOut), reply
            self._on_delivered(world, node, entry, req, list(reply.deliveries))
        elif req.kind == "settle_checkout":
            assert isinstance(reply, SettledCheckedOut), reply
            self._on_settled(entry, req, reply.settled)
            self._on_delivered(world, node, entry, req, list(reply.checked_out.deliveries))
        elif req.kind in ("settle", "return"):
            assert isinstance(reply, Settled), reply
            if req.kind == "settle":
                self._on_settled(entry, req, reply)
        self._next(world, req)

    def _on_settled(self, entry: Entry, req: _Request, reply: Settled) -> None:
        stale = set(reply.stale)
        for k, (_tag, _ref, mid) in enumerate(req.receipts):
            if k not in stale:
                self.settled[mid] = entry.index

    def _on_delivered(
        self, world: World, node: SimNode, entry: Entry, req: _Request, got: list[Delivery]
    ) -> None:
        machine = node.machine
        assert isinstance(machine, QueueMachine)
        receipts: list[tuple[int, int, int]] = []
        for position, d in enumerate(got):
            parts = machine.ref_parts(d.ref)
            mid = message_id(parts.index, parts.slot)
            body = bytes(read_message(node.storage.entry(parts.index).data, parts.slot).body)
            if self.published.get(body) != d.priority:
                self._fail(world, f"delivered {body!r} at priority {d.priority}, not as published")
            if self.confirmed.get(mid, body) != body:
                self._fail(world, f"message {mid} delivered with body {body!r}")
            self.deliveries.append((entry.index, position, d.priority, mid, d.delivery_count))
            receipts.append((d.tag, d.ref, mid))
        if not receipts:
            return
        roll = self.rng.randrange(20)
        if roll < 10:
            kind, encode = "settle", encode_settle
        elif roll < 15:
            self.settle_sent.update(mid for _tag, _ref, mid in receipts)
            self.acks_for_next[req.client] = receipts  # the next checkout carries them
            return
        elif roll < 17:
            kind, encode = "return", encode_return
        else:
            return  # the consumer walks away: the leases expire
        command = encode([(tag, ref) for tag, ref, _mid in receipts])
        ack = _Request(kind, req.client, command, world.now_ms + self.timeout_ms)
        ack.receipts = receipts
        if kind == "settle":
            self.settle_sent.update(mid for _tag, _ref, mid in receipts)
        world.schedule(self.rng.randint(1, LEASE_MS // 2), lambda: self._send(world, ack))

    def on_crash(self, world: World, node: SimNode) -> None:
        for rid, req in list(self.inflight.items()):
            if req.server == node.id:
                del self.inflight[rid]
                self._retry_or_give_up(world, req)

    # --- checks ---------------------------------------------------------------------------

    def _fail(self, world: World, text: str) -> None:
        if len(self.found) < 10:
            self.found.append(f"t={world.now_ms} queue: {text}")

    def _check_same_state(self, world: World, node: SimNode, index: int) -> None:
        if node.raft.applied != index:
            return
        digest = hashlib.sha256(node.machine.snapshot()).digest()
        seen = self.digests.setdefault(index, digest)
        if seen != digest:
            self._fail(world, f"{node.id} has another machine state at index {index}")

    def after_step(self, world: World) -> None:
        self.steps_seen += 1
        if self.page_budget is not None:
            for node in world.live_nodes():
                assert isinstance(node.machine, QueueMachine)
                pager = node.machine.pager
                if pager is not None and pager.wants_read_ahead:
                    pager.read_ahead()
        if self.steps_seen % 10:
            return
        for node in world.live_nodes():
            machine = node.machine
            assert isinstance(machine, QueueMachine)
            try:
                machine.check_invariants()
            except AssertionError as exc:
                self._fail(world, f"{node.id} counts differ from contents: {exc}")

    def violations(self) -> list[str]:
        return list(self.found)

    def finish(self, world: World) -> list[str]:
        self._check_history(world)
        self._check_nothing_lost(world)
        return list(self.found)

    def _check_history(self, world: World) -> None:
        last_first: dict[int, int] = {}
        for index, _pos, priority, mid, count in sorted(self.deliveries):
            settled_at = self.settled.get(mid)
            if settled_at is not None and index > settled_at:
                self._fail(
                    world, f"message {mid} delivered at {index} after settled at {settled_at}"
                )
            if count == 1:
                if mid <= last_first.get(priority, -1):
                    self._fail(world, f"first deliveries out of order at priority {priority}")
                last_first[priority] = mid

    def _check_nothing_lost(self, world: World) -> None:
        nodes = world.live_nodes()
        if not nodes:
            return
        node = max(nodes, key=lambda n: n.raft.applied)
        applied = node.raft.applied
        machine = node.machine
        assert isinstance(machine, QueueMachine)
        held = {self._mid(machine, ref) for _tag, ref in machine.pending_items()}
        after: int | None = None
        while page := machine.browse(after, 1000):
            held.update(self._mid(machine, item.ref) for item in page)
            after = page[-1].cursor
        for mid in sorted(self.confirmed):
            if mid >> 10 > applied:
                continue
            settled_at = self.settled.get(mid)
            if settled_at is not None and settled_at <= applied:
                if mid in held:
                    self._fail(world, f"settled message {mid} still on the queue")
            elif mid not in held and mid not in self.settle_sent:
                self._fail(world, f"confirmed message {mid} lost ({node.id}, applied {applied})")

    @staticmethod
    def _mid(machine: QueueMachine, ref: int) -> int:
        parts = machine.ref_parts(ref)
        return message_id(parts.index, parts.slot)


def run_queue_seed(
    seed: int,
    steps: int = 3000,
    servers: int = 3,
    page_budget: int | None = None,
    publishers: int = 2,
    consumers: int = 2,
    sleeps: bool = False,
) -> SeedResult:
    """Run one seed of the queue workload on a simulated cluster (``page_budget``: see
    the module's docstring). ``sleeps``: one server that sleeps and wakes, and crashes
    only right after a wake (``SimConfig.sleeps``).

    The workload is also registered as an observer, for ``after_step`` and (with worlds
    that do not hand applied entries to the workload) ``on_applied``.
    """
    from engine.sim.world import SimConfig, World

    started = time.perf_counter()
    made: list[QueueWorkload] = []

    def factory(rng: random.Random) -> QueueWorkload:
        made.append(QueueWorkload(rng, publishers, consumers, page_budget=page_budget))
        return made[-1]

    config = SimConfig(seed=seed, servers=servers, steps=steps)
    if sleeps:
        config = SimConfig(seed=seed, servers=1, steps=steps, crashes=False, sleeps=True)
    world = World(config, workload_factory=factory)
    world.observers.append(made[0])
    violations = world.run()
    return SeedResult.of(seed, world, violations, made[0].completed, started)


def main(argv: list[str]) -> int:
    """``python -m engine.sim.queue_workload --seeds N [--first-seed S] [--steps M]
    [--page-budget P]``."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m engine.sim.queue_workload")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--page-budget", type=int, default=None, help="resident pages per queue")
    args = p.parse_args(argv)
    failed = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        result = run_queue_seed(seed, steps=args.steps, page_budget=args.page_budget)
        if not result.passed:
            failed += 1
            print(f"seed {seed} FAILED: {result.violations[0]}")
            for line in result.trace[-12:]:
                print(f"    {line}")
    print(f"{args.seeds - failed} passed, {failed} failed")
    return 1 if failed else 0


__all__ = ["QueueWorkload", "main", "run_queue_seed"]

if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
