"""A hand-driven cluster for unit tests: each server has a MemStorage that persists at
once (or when told), and messages wait in a list until a test delivers them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from engine.ids import ServerId
from engine.limits import Limits
from engine.raft.config import Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import (
    Event,
    Persisted,
    Ready,
    Receive,
    SnapshotInstalled,
    SnapshotTaken,
    Tick,
)
from engine.raft.kv import KvMachine
from engine.raft.messages import (
    AppendRequest,
    AppendResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from engine.raft.server import Fault, RaftOptions, RaftServer, Role
from engine.raft.snapshot import Snapshot
from engine.raft.state_machine import ApplyMeta
from engine.sim.storage import MemStorage

LIMITS = Limits()


def sid(name: str) -> ServerId:
    return ServerId(name)


# Messages a test hands to a server itself, between servers named by string. The
# fields a test does not care about default to an empty log at term 0; the integers
# stay keywords, as in the message classes.


def vote_request(
    src: str,
    dst: str,
    term: int,
    *,
    last_index: int = 0,
    last_term: int = 0,
    pre: bool = False,
    transfer: bool = False,
) -> VoteRequest:
    return VoteRequest(
        src=sid(src),
        dst=sid(dst),
        term=term,
        last_index=last_index,
        last_term=last_term,
        pre=pre,
        transfer=transfer,
    )


def append_request(
    src: str,
    dst: str,
    term: int,
    *,
    prev_index: int,
    prev_term: int,
    entries: list[Entry] | None = None,
    commit: int,
) -> AppendRequest:
    return AppendRequest(
        src=sid(src),
        dst=sid(dst),
        term=term,
        prev_index=prev_index,
        prev_term=prev_term,
        entries=entries or [],
        commit=commit,
    )


def append_response(
    src: str,
    dst: str,
    term: int,
    *,
    success: bool,
    match_index: int = 0,
    rejected_prev_index: int = 0,
    conflict_term: int = 0,
    conflict_index: int = 0,
) -> AppendResponse:
    return AppendResponse(
        src=sid(src),
        dst=sid(dst),
        term=term,
        success=success,
        match_index=match_index,
        rejected_prev_index=rejected_prev_index,
        conflict_term=conflict_term,
        conflict_index=conflict_index,
    )


@dataclass
class Node:
    raft: RaftServer
    storage: MemStorage
    machine: KvMachine = field(default_factory=KvMachine)
    readies: list[Ready] = field(default_factory=list)
    auto_persist: bool = True
    unpersisted: list[Ready] = field(default_factory=list)


class Cluster:
    def __init__(
        self,
        names: list[str],
        voters: list[str] | None = None,
        limits: Limits = LIMITS,
        fault: Fault = Fault.NONE,
        pre_vote: bool = True,
        check_quorum: bool = True,
    ) -> None:
        self.limits = limits
        self.fault = fault
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        self.config = Configuration(tuple(sorted(sid(n) for n in (voters or names))))
        self.nodes: dict[str, Node] = {}
        self.sent: list[Message] = []
        self.cut: set[str] = set()
        self.now_ms = 0
        for n, name in enumerate(names):
            self.nodes[name] = self._new_node(name, MemStorage(), n)

    def _new_node(self, name: str, storage: MemStorage, seed: int, repair: bool = False) -> Node:
        options = RaftOptions(
            sid(name),
            random.Random(seed),
            self.limits,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            fault=self.fault,
        )
        hs, snap = storage.recover()
        meta = snap.meta if snap is not None else None
        raft = RaftServer(options, storage, hs, meta, self.config, self.now_ms, repair=repair)
        node = Node(raft, storage)
        if snap is not None:
            node.machine.restore(snap.machine_state)
        return node

    def restart(self, name: str, lose_unsynced: bool = True, repair: bool = False) -> None:
        old = self.nodes[name]
        if lose_unsynced:
            old.storage.crash(random.Random(0), tear=False)
        self.nodes[name] = self._new_node(name, old.storage, 99, repair)
        self.process(name)

    def __getitem__(self, name: str) -> RaftServer:
        return self.nodes[name].raft

    # --- driving ----------------------------------------------------------------------

    def step(self, name: str, event: Event) -> Ready:
        node = self.nodes[name]
        node.raft.step(event)
        node.raft.check_invariants()
        return self.process(name)

    def process(self, name: str) -> Ready:
        """Act on every Ready of ``name``; returns them merged (for assertions)."""
        node = self.nodes[name]
        merged = Ready()
        while True:
            rd = node.raft.ready()
            if rd.is_empty():
                return merged
            node.readies.append(rd)
            _merge(merged, rd)
            node.storage.write(
                rd.hard_state, rd.snapshot_to_install, rd.entries_to_persist, rd.snapshot_entries
            )
            if rd.snapshot_to_install is not None:
                node.machine.restore(rd.snapshot_to_install.machine_state)
            self.sent.extend(rd.messages)
            for e in rd.committed_entries:
                if e.kind is EntryKind.COMMAND:
                    node.machine.apply(ApplyMeta(e.index, e.term, e.now_ms), e.data)
            if node.auto_persist:
                self._persisted(node, rd)
            else:
                node.unpersisted.append(rd)

    def persist(self, name: str) -> Ready:
        node = self.nodes[name]
        pending, node.unpersisted = node.unpersisted, []
        for rd in pending:
            self._persisted(node, rd)
        return self.process(name)

    def _persisted(self, node: Node, rd: Ready) -> None:
        node.storage.sync()
        self.sent.extend(rd.messages_after_persist)
        if rd.snapshot_to_install is not None:
            snap = rd.snapshot_to_install
            node.raft.step(SnapshotInstalled(snap.index, snap.term))
        if rd.entries_to_persist:
            last = rd.entries_to_persist[-1]
            node.raft.step(Persisted(last.index, last.term))

    def tick(self, ms: int, names: list[str] | None = None, deliver: bool = False) -> None:
        """Advance the clock by ``ms`` in steps of ``tick_ms``, ticking ``names``, and
        with ``deliver`` delivering every message after each tick."""
        end = self.now_ms + ms
        while self.now_ms < end:
            self.now_ms += self.limits.tick_ms
            for name in names or list(self.nodes):
                self.step(name, Tick(self.now_ms))
            if deliver:
                self.stabilize()

    def take(self, kind: type | None = None, dst: str | None = None) -> list[Message]:
        """Remove and return the pending messages that match."""
        out = [
            m
            for m in self.sent
            if (kind is None or type(m) is kind) and (dst is None or m.dst == dst)
        ]
        self.sent = [m for m in self.sent if m not in out]
        return out

    def deliver(self, messages: list[Message]) -> None:
        for m in messages:
            if m.src in self.cut or m.dst in self.cut or m.dst not in self.nodes:
                continue
            self.step(m.dst, Receive(m))

    def stabilize(self, rounds: int = 200) -> None:
        for _ in range(rounds):
            if not self.sent:
                return
            batch, self.sent = self.sent, []
            self.deliver(batch)
        raise AssertionError("the cluster did not go quiet")

    def elect(self, name: str) -> None:
        """Make ``name`` campaign at once and deliver everything until quiet."""
        node = self.nodes[name].raft
        node.election_deadline_ms = self.now_ms
        self.now_ms += 1
        self.step(name, Tick(self.now_ms))
        self.stabilize()
        assert node.role is Role.LEADER, node.role

    def campaign(self, name: str) -> None:
        """``name`` campaigns now; only vote traffic is delivered (``elect`` delivers
        everything and insists on a win)."""
        self[name].election_deadline_ms = 0
        self.now_ms += 1
        self.step(name, Tick(self.now_ms))
        for _ in range(3):
            self.deliver(self.take(VoteRequest))
            self.deliver(self.take(VoteResponse))

    def take_snapshot(self, name: str) -> Snapshot:
        node = self.nodes[name]
        raft = node.raft
        index = raft.applied
        term = raft.log.term(index)
        assert term is not None
        live = node.machine.live_indexes()
        snap = Snapshot(index, term, raft.config_at(index), node.machine.snapshot(), live)
        node.storage.save_snapshot(snap)
        raft.step(SnapshotTaken(snap))
        return snap


def _merge(into: Ready, rd: Ready) -> None:
    into.hard_state = rd.hard_state or into.hard_state
    into.snapshot_to_install = rd.snapshot_to_install or into.snapshot_to_install
    into.snapshot_entries += rd.snapshot_entries
    into.entries_to_persist += rd.entries_to_persist
    into.messages += rd.messages
    into.messages_after_persist += rd.messages_after_persist
    into.committed_entries += rd.committed_entries
    into.reads += rd.reads
    into.accepted += rd.accepted
    into.rejected += rd.rejected
    into.completed += rd.completed
    into.repaired = into.repaired or rd.repaired


def commands(log: list[int]) -> list[int]:
    return log
