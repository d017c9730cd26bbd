"""``quorra bench raft [--json] [--entries N] [--batch B] [--window W]``: a 3-server Raft
group in one process, in-memory transport and storage, 1 KiB commands, KV machine applied
on every replica. Reports committed entries per second (as seen by the leader's
machine; wall clock, so other load on the machine lowers it), the same per CPU second of
this process (what one free core would give), entries per AppendEntries message and CPU
seconds per 1000 entries.

Storage is a list that is "durable" at once, so this measures the core and its
batching, not a disk. Clients keep ``window`` entries in flight, proposing ``batch`` at
a time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import deque
from typing import Any

import bench
from engine.ids import ServerId
from engine.limits import Limits
from engine.raft.config import Configuration
from engine.raft.events import Persisted, Propose, Ready, Receive, Tick
from engine.raft.kv import KvMachine, encode_put
from engine.raft.log import Entry, EntryKind
from engine.raft.machine import ApplyMeta
from engine.raft.messages import AppendRequest, Message
from engine.raft.server import RaftOptions, RaftServer, Role

COMMAND_BYTES = 1024


class ListStore:
    """A ``LogStore`` over a Python list; writes are durable at once."""

    def __init__(self) -> None:
        self.log: list[Entry] = []

    def first_index(self) -> int:
        return 1

    def last_index(self) -> int:
        return len(self.log)

    def snapshot_index(self) -> int:
        return 0

    def term(self, index: int) -> int | None:
        if index == 0:
            return 0
        return self.log[index - 1].term if 0 < index <= len(self.log) else None

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        out = self.log[lo - 1 : hi - 1]
        if max_bytes >= len(out) * COMMAND_BYTES * 2:
            return out
        size = 0
        for n, e in enumerate(out):
            size += len(e.data)
            if size > max_bytes and n:
                return out[:n]
        return out

    def write(self, entries: list[Entry]) -> None:
        first = entries[0].index
        if first <= len(self.log):
            del self.log[first - 1 :]
        self.log.extend(entries)


class Cluster:
    def __init__(self, limits: Limits) -> None:
        ids = [ServerId(f"s{n}") for n in (1, 2, 3)]
        config = Configuration(tuple(ids))
        self.stores = {sid: ListStore() for sid in ids}
        self.machines = {sid: KvMachine() for sid in ids}
        self.servers = {
            sid: RaftServer(
                RaftOptions(sid, random.Random(n), limits), self.stores[sid], bootstrap=config
            )
            for n, sid in enumerate(ids)
        }
        self.inbox: deque[Message] = deque()
        self.appends = 0
        self.appended_entries = 0
        self.applied: dict[ServerId, int] = dict.fromkeys(ids, 0)

    def run_ready(self, sid: ServerId) -> None:
        server = self.servers[sid]
        rd: Ready = server.ready()
        if rd.entries_to_persist:
            self.stores[sid].write(rd.entries_to_persist)
        for msg in rd.messages:
            if type(msg) is AppendRequest:
                self.appends += 1
                self.appended_entries += len(msg.entries)
        self.inbox.extend(rd.messages)
        self.inbox.extend(rd.messages_after_persist)
        if rd.committed_entries:
            machine = self.machines[sid]
            command = EntryKind.COMMAND
            for e in rd.committed_entries:
                if e.kind is command:
                    machine.apply(ApplyMeta(e.index, e.term, e.now_ms), e.data)
            self.applied[sid] = rd.committed_entries[-1].index
        if rd.entries_to_persist:
            last = rd.entries_to_persist[-1]
            server.step(Persisted(last.index, last.term))
            self.run_ready(sid)

    def pump(self) -> None:
        """Deliver messages until the network is quiet, batching per receiver."""
        servers = self.servers
        while self.inbox:
            touched: dict[ServerId, None] = {}
            batch, self.inbox = self.inbox, deque()
            for msg in batch:
                servers[msg.dst].step(Receive(msg))
                touched[msg.dst] = None
            for sid in touched:
                self.run_ready(sid)

    def tick_all(self, now_ms: int) -> None:
        for sid, server in self.servers.items():
            server.step(Tick(now_ms))
            self.run_ready(sid)

    def leader(self) -> ServerId | None:
        for sid, server in self.servers.items():
            if server.role is Role.LEADER:
                return sid
        return None


def run(entries: int, batch: int, window: int) -> dict[str, Any]:
    limits = Limits()
    cluster = Cluster(limits)
    now_ms = 0
    while cluster.leader() is None or cluster.applied[cluster.leader() or ServerId("")] < 1:
        now_ms += limits.tick_ms
        cluster.tick_all(now_ms)
        cluster.pump()
    leader = cluster.leader()
    assert leader is not None
    server = cluster.servers[leader]
    overhead = len(encode_put("key0000", b""))
    value = bytes(COMMAND_BYTES - overhead - 1)  # bin8 -> bin16 header: one byte more
    commands = tuple(encode_put(f"key{n % 1024:04d}", value) for n in range(batch))
    assert all(len(c) == COMMAND_BYTES for c in commands), len(commands[0])
    base = cluster.applied[leader]
    target = base + entries
    proposed = base
    request = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    tick_wall = wall0
    while cluster.applied[leader] < target:
        while proposed - cluster.applied[leader] < window and proposed < target:
            request += 1
            server.step(Propose(request, commands))
            proposed += batch
        cluster.run_ready(leader)
        cluster.pump()
        wall = time.perf_counter()
        if wall - tick_wall >= limits.tick_ms / 1000:
            tick_wall = wall
            now_ms += limits.tick_ms
            cluster.tick_all(now_ms)
    wall_s = time.perf_counter() - wall0
    cpu_s = time.process_time() - cpu0
    committed = cluster.applied[leader] - base
    assert cluster.leader() == leader, "leadership changed during the run"
    return {
        "bench": "raft",
        "servers": 3,
        "command_bytes": len(commands[0]),
        "committed_entries": committed,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "committed_entries_per_s": round(committed / wall_s),
        "entries_per_append": round(cluster.appended_entries / max(1, cluster.appends), 1),
        "cpu_s_per_1k_entries": round(cpu_s / committed * 1000, 5),
        "committed_entries_per_cpu_s": round(committed / cpu_s),
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "proposal_batch": batch,
        "window_entries": window,
        "machine": "kv, applied on all 3 replicas",
        "machine_info": bench.machine_info(),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="quorra bench raft", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--entries", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=256, help="commands per proposal")
    p.add_argument("--window", type=int, default=4096, help="entries in flight")
    args = p.parse_args(argv)
    figures = run(args.entries, args.batch, args.window)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        print(json.dumps(figures, indent=2, sort_keys=True))
    return 0
