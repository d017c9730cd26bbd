"""Workloads: clients that drive a machine through the simulated cluster and judge the
history they saw. ``Workload`` is the plug point (a queue workload brings its own machine
and checks); ``KvWorkload`` runs put/get clients on the KV machine and checks that the
history is linearizable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine.ids import ServerId
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Accepted, ReadReady, Rejected
from engine.raft.kv import KvMachine, encode_put
from engine.raft.state_machine import Machine
from engine.sim.checkers import Observer, RegisterOp, check_register

if TYPE_CHECKING:
    from engine.sim.world import SimNode, World


class Workload(Protocol):
    """What the world needs of a workload; it is also an ``Observer`` of every server."""

    def make_machine(self) -> Machine: ...

    def start(self, world: World) -> None:
        """Schedule the first client actions (``world.schedule``)."""
        ...

    def on_accepted(self, world: World, node: SimNode, accepted: Accepted) -> None: ...

    def on_rejected(self, world: World, node: SimNode, rejected: Rejected) -> None: ...

    def on_read(self, world: World, node: SimNode, read: ReadReady) -> None: ...

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        """Every committed entry a server applies, with the machine's reply."""
        ...

    def on_crash(self, world: World, node: SimNode) -> None: ...

    def finish(self, world: World) -> list[str]:
        """Violations found in the whole history, checked at the end of the run."""
        ...


@dataclass(slots=True)
class _Pending:
    client: int
    op: RegisterOp
    key: str
    server: ServerId | None = None
    request_id: int = 0
    index: int = 0
    term: int = 0
    deadline_ms: int = 0


class KvWorkload(Observer):
    """``clients`` clients, each with one operation in flight: a put of a unique value or
    a ReadIndex get, on a few keys. An operation whose outcome is unknown (timeout, the
    server crashed) is recorded as such; a definite rejection is retried elsewhere."""

    def __init__(
        self, rng: random.Random, clients: int = 4, keys: int = 3, timeout_ms: int | None = None
    ) -> None:
        self.rng = rng
        self.clients = clients
        self.keys = [f"k{n}" for n in range(keys)]
        self.timeout_ms = timeout_ms or rng.choice([100, 250, 800])
        self.history: dict[str, list[RegisterOp]] = {k: [] for k in self.keys}
        self.inflight: dict[int, _Pending] = {}
        """By request id."""
        self.leader_hint: dict[int, ServerId | None] = dict.fromkeys(range(clients))
        """Each client's idea of the leader (clients disagree, as real ones do)."""
        self.next_request = 0
        self.next_value = 0
        self.completed = 0

    def make_machine(self) -> Machine:
        return KvMachine()

    def start(self, world: World) -> None:
        for client in range(self.clients):
            self._next(world, client)

    # --- client actions --------------------------------------------------------------

    def _issue(self, world: World, client: int) -> None:
        key = self.rng.choice(self.keys)
        if self.rng.randrange(2):
            self.next_value += 1
            value = f"c{client}v{self.next_value}".encode()
            op = RegisterOp(client, "put", value, world.now_ms, None)
        else:
            op = RegisterOp(client, "get", None, world.now_ms, None)
        self.history[key].append(op)
        pending = _Pending(client, op, key, deadline_ms=world.now_ms + self.timeout_ms)
        self._send(world, pending)

    def _send(self, world: World, pending: _Pending) -> None:
        if world.now_ms >= pending.deadline_ms:
            self._give_up(world, pending)
            return
        self.next_request += 1
        pending.request_id = self.next_request
        self.inflight[pending.request_id] = pending
        server = self.leader_hint[pending.client] or self.rng.choice(world.server_ids())
        pending.server = server
        rid = pending.request_id
        world.schedule(pending.deadline_ms - world.now_ms, lambda: self._timeout(world, rid))
        if pending.op.kind == "put":
            assert pending.op.value is not None
            world.propose(server, rid, (encode_put(pending.key, pending.op.value),))
        else:
            world.read(server, rid)

    def _timeout(self, world: World, request_id: int) -> None:
        pending = self.inflight.pop(request_id, None)
        if pending is not None:
            self.leader_hint[pending.client] = None
            self._give_up(world, pending)

    def _give_up(self, world: World, pending: _Pending) -> None:
        if pending.op.kind == "get":
            self.history[pending.key].remove(pending.op)
        self._next(world, pending.client)

    def _done(self, world: World, pending: _Pending) -> None:
        pending.op.ret_ms = world.now_ms
        self.completed += 1
        self._next(world, pending.client)

    def _next(self, world: World, client: int) -> None:
        world.schedule(self.rng.randint(1, 30), lambda: self._issue(world, client))

    # --- answers from servers ----------------------------------------------------------

    def on_accepted(self, world: World, node: SimNode, accepted: Accepted) -> None:
        pending = self.inflight.get(accepted.request_id)
        if pending is not None:
            pending.index, pending.term = accepted.last_index, accepted.term

    def on_rejected(self, world: World, node: SimNode, rejected: Rejected) -> None:
        pending = self.inflight.pop(rejected.request_id, None)
        if pending is None:
            return
        hint = rejected.leader if rejected.leader != node.id else None
        self.leader_hint[pending.client] = hint
        if pending.op.kind == "put" and rejected.reason == "lost_leadership":
            return self._give_up(world, pending)
        retry_ms = self.rng.randint(5, 40)
        world.schedule(retry_ms, lambda: self._send(world, pending))

    def on_applied(self, world: World, node: SimNode, entry: Entry, reply: object) -> None:
        if entry.kind is not EntryKind.COMMAND:
            return
        for rid, pending in list(self.inflight.items()):
            if pending.server == node.id and pending.index == entry.index:
                del self.inflight[rid]
                if pending.term == entry.term:
                    self.leader_hint[pending.client] = node.id
                    self._done(world, pending)
                else:
                    self._give_up(world, pending)

    def on_read(self, world: World, node: SimNode, read: ReadReady) -> None:
        pending = self.inflight.pop(read.request_id, None)
        if pending is None:
            return
        machine = node.machine
        assert isinstance(machine, KvMachine)
        pending.op.value = machine.get(pending.key, lambda i: node.storage.entry(i).data)
        self.leader_hint[pending.client] = node.id
        self._done(world, pending)

    def on_crash(self, world: World, node: SimNode) -> None:
        for rid, pending in list(self.inflight.items()):
            if pending.server == node.id:
                del self.inflight[rid]
                self._give_up(world, pending)

    def finish(self, world: World) -> list[str]:
        found = []
        for key in self.keys:
            if not check_register(self.history[key]):
                found.append(f"linearizability: history of key {key} has no linearization")
        return found


__all__ = ["KvWorkload", "Workload"]
