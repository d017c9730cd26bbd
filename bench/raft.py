"""Committed 1 KiB entries per second of a 3-server Raft group in one process.

``quorra bench raft [--json] [--quick] [--entries N] [--batch B] [--window W] [--rounds R]``:
in-memory transport and storage, 1 KiB commands, KV machine applied on every replica.
Storage is a list that is "durable" at once, so this measures the core and its
batching, not a disk. Clients keep ``window`` entries in flight, proposing ``batch`` at
a time. Each round is a fresh group; the figures are the median of ``--rounds`` rounds
(3; 1 with ``--quick``), each round's are in ``rounds``. Throughput is wall clock, so
other load on the machine lowers it: compare runs with the load average in ``machine``.

JSON keys (``JSON_KEYS``), the headline being ``committed_entries_per_s``:

* ``bench``: "raft";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``servers``: servers in the group (3);
* ``state_machine``: what the replicas apply;
* ``command_bytes``: bytes per command (1024);
* ``proposal_batch``: commands per proposal (``--batch``);
* ``window_entries``: entries in flight (``--window``);
* ``entries_per_round``: committed entries per round (``--entries``);
* ``committed_entries_per_s``: the headline: committed entries per wall second, as seen
  by the leader's machine, median of the rounds;
* ``committed_entries_per_cpu_s``: the same per CPU second of this process (what one
  free core would give), median;
* ``cpu_s_per_1k_entries``: CPU seconds per 1000 entries, median;
* ``entries_per_append``: entries per AppendEntries message, median;
* ``rounds``: each round's figures (``committed_entries``, ``wall_s``, ``cpu_s`` and the
  four above).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import deque
from typing import Any

import bench
from engine.ids import ServerId
from engine.limits import Limits
from engine.raft.config import Configuration
from engine.raft.entry import Entry, EntryKind
from engine.raft.events import Persisted, Propose, Ready, Receive, Tick
from engine.raft.kv import KvMachine, encode_put
from engine.raft.messages import AppendRequest, Message
from engine.raft.server import RaftOptions, RaftServer, Role
from engine.raft.state_machine import ApplyMeta

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

    def entry(self, index: int) -> Entry:
        if not 0 < index <= len(self.log):
            raise LookupError(index)
        return self.log[index - 1]

    def config_indexes(self, lo: int, hi: int) -> list[int]:
        return [e.index for e in self.log[lo - 1 : hi - 1] if e.kind is EntryKind.CONFIG]

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


JSON_KEYS = (
    "bench",
    "machine",
    "servers",
    "state_machine",
    "command_bytes",
    "proposal_batch",
    "window_entries",
    "entries_per_round",
    "committed_entries_per_s",
    "committed_entries_per_cpu_s",
    "cpu_s_per_1k_entries",
    "entries_per_append",
    "rounds",
)
HEADLINE_KEY = "committed_entries_per_s"
MEDIAN_KEYS = (
    "committed_entries_per_s",
    "committed_entries_per_cpu_s",
    "cpu_s_per_1k_entries",
    "entries_per_append",
)
QUICK_ENTRIES = 20_000


def run(entries: int, batch: int, window: int) -> dict[str, Any]:
    """One round on a fresh group: its figures."""
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
        "committed_entries": committed,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "committed_entries_per_s": round(committed / wall_s),
        "committed_entries_per_cpu_s": round(committed / cpu_s),
        "cpu_s_per_1k_entries": round(cpu_s / committed * 1000, 5),
        "entries_per_append": round(cluster.appended_entries / max(1, cluster.appends), 1),
    }


def main(argv: list[str]) -> int:
    p = bench.parser("raft", __doc__)
    p.add_argument("--entries", type=int, default=300_000, help="committed entries per round")
    p.add_argument("--batch", type=int, default=256, help="commands per proposal")
    p.add_argument("--window", type=int, default=4096, help="entries in flight")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the figures are the median")
    args = p.parse_args(argv)
    if args.quick:
        args.entries, args.rounds = min(args.entries, QUICK_ENTRIES), 1
    if min(args.entries, args.batch, args.window, args.rounds) < 1:
        p.error("--entries, --batch, --window and --rounds are at least 1")
    figures: dict[str, Any] = bench.header("raft") | {
        "servers": 3,
        "state_machine": "kv, applied on all 3 replicas",
        "command_bytes": COMMAND_BYTES,
        "proposal_batch": args.batch,
        "window_entries": args.window,
        "entries_per_round": args.entries,
    }
    rounds = [run(args.entries, args.batch, args.window) for _ in range(args.rounds)]
    for key in MEDIAN_KEYS:
        figures[key] = statistics.median(r[key] for r in rounds)
    figures["rounds"] = rounds
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0
