"""Time to reopen a queue holding N messages, in one process (storage and machine).

``quorra bench recovery [--json] [--quick] [--messages N] [--machine queue|packed]``:

Fill one queue with N small messages (``--per-entry`` messages per log entry, as a
publish batch is one entry), take a checkpoint, append ``--tail`` more messages (one per
entry, the slowest case for replay), stop, and time the recovery in this process: open
the data directory (WAL replay, segment headers), load the newest checkpoint, restore
the machine and re-apply the entries after it, until the queue is ready to serve. The
recovered machine's snapshot is compared with the original's.

Two stops are timed: ``crash`` (the process just stops: everything was synced, the last
WAL file is replayed, so this grows with the WAL, bounded by ``wal_file_bytes_max``,
not with N) and ``clean`` (``close()`` rolls the WAL and flushes mem tables to
segments; ``recovery_ms`` is this one). Files are fresh in the page cache.

The machine is pluggable (``--machine``): ``queue`` is ``engine.queue.QueueMachine``;
``packed`` is a stand-in whose state is one numpy array of packed references.
``--quick``: 10,000 messages and a tail of 1,000.

JSON keys (``JSON_KEYS``), the headline being ``recovery_ms``:

* ``bench``: "recovery";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``machine_kind``: the queue machine measured (``--machine``);
* ``messages``: messages before the checkpoint (``--messages``);
* ``messages_per_entry``: of those, per log entry (``--per-entry``);
* ``tail_messages``: messages after the checkpoint (``--tail``);
* ``tail_messages_per_entry``: of those, per log entry (``--tail-per-entry``);
* ``log_entries``: entries in the queue's log;
* ``checkpoint_bytes``: size of the machine's state in the checkpoint;
* ``fill_s``: time to fill the queue (not part of the recovery);
* ``recovery_ms``: the headline: wall time of the recovery after a clean stop;
* ``recovery_cpu_ms``: CPU time of the same;
* ``clean_stop``: the phases of the recovery after a clean stop (ms, entries replayed);
* ``crash_stop``: the same after a crash.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

import bench
from engine.limits import DEFAULT_LIMITS
from engine.raft.entry import Entry, EntryKind
from engine.raft.state_machine import ApplyMeta, Machine, MachineEffect
from engine.storage import Checkpoint, NodeStorage, OsDisk

JSON_KEYS = (
    "bench",
    "machine",
    "machine_kind",
    "messages",
    "messages_per_entry",
    "tail_messages",
    "tail_messages_per_entry",
    "log_entries",
    "checkpoint_bytes",
    "fill_s",
    "recovery_ms",
    "recovery_cpu_ms",
    "clean_stop",
    "crash_stop",
)
HEADLINE_KEY = "recovery_ms"
QUICK_MESSAGES = 10_000
QUICK_TAIL = 1_000
UID = "bench-queue"
_ENQ = struct.Struct("<II")


class PackedRefsMachine:
    """Stand-in queue: one uint64 per message, ``index << 20 | slot << 10 | size``.
    Applied enqueues are kept as (index, count, size) until the next snapshot packs them."""

    version: ClassVar[int] = 1

    def __init__(self) -> None:
        self._applied: list[tuple[int, int, int]] = []
        self._refs: npt.NDArray[np.uint64] = np.empty(0, dtype=np.uint64)

    def apply(self, meta: ApplyMeta, command: bytes) -> tuple[object, list[MachineEffect]]:
        count, size = _ENQ.unpack_from(command)
        self._applied.append((meta.index, count, size))
        return count, []

    def _all(self) -> npt.NDArray[np.uint64]:
        if self._applied:
            table = np.array(self._applied, dtype=np.uint64)
            counts = table[:, 1].astype(np.int64)
            starts = np.repeat(np.cumsum(counts) - counts, counts)
            slots = (np.arange(int(counts.sum())) - starts).astype(np.uint64)
            index = np.repeat(table[:, 0], counts)
            size = np.repeat(table[:, 2], counts)
            new = (index << np.uint64(20)) | (slots << np.uint64(10)) | size
            self._refs = np.concatenate([self._refs, new])
            self._applied = []
        return self._refs

    def live_indexes(self) -> BitMap64:
        return BitMap64(np.unique(self._all() >> np.uint64(20)))

    def snapshot(self) -> bytes:
        return self._all().tobytes()

    def restore(self, data: bytes) -> None:
        self._applied = []
        self._refs = np.frombuffer(data, dtype=np.uint64)


class Kit(Protocol):
    def new(self) -> Machine: ...

    def enqueue(self, messages: int, body: bytes) -> bytes: ...


class PackedKit:
    def new(self) -> Machine:
        return PackedRefsMachine()

    def enqueue(self, messages: int, body: bytes) -> bytes:
        return _ENQ.pack(messages, len(body)) + body * messages


class QueueKit:
    def new(self) -> Machine:
        from engine.queue import QueueMachine

        return QueueMachine()

    def enqueue(self, messages: int, body: bytes) -> bytes:
        from engine.queue import NewMessage, encode_enqueue

        return encode_enqueue([NewMessage(body) for _ in range(messages)])


KITS: dict[str, Kit] = {"packed": PackedKit(), "queue": QueueKit()}


@dataclass
class Filled:
    machine: Machine
    last_index: int
    checkpoint_index: int
    checkpoint_bytes: int


def fill(
    directory: str,
    kit: Kit,
    messages: int,
    per_entry: int,
    tail: int,
    tail_per_entry: int,
    body: bytes,
) -> Filled:
    storage = NodeStorage.open(OsDisk(directory), DEFAULT_LIMITS)
    storage.open_server(UID)
    machine = kit.new()
    index = 0

    def append(command: bytes, count: int) -> None:
        nonlocal index
        for lo in range(0, count, 1000):
            batch = [
                Entry(index + 1 + k, 1, EntryKind.COMMAND, index + 1 + k, command)
                for k in range(min(1000, count - lo))
            ]
            storage.append(UID, batch)
            storage.sync()
            for e in batch:
                machine.apply(ApplyMeta(e.index, e.term, e.now_ms), e.data)
            index += len(batch)

    full, rest = divmod(messages, per_entry)
    append(kit.enqueue(per_entry, body), full)
    if rest:
        append(kit.enqueue(rest, body), 1)
    state = machine.snapshot()
    storage.write_checkpoint(
        UID, Checkpoint(index, 1, machine.version, b"", machine.live_indexes(), state)
    )
    checkpoint_index = index
    full, rest = divmod(tail, tail_per_entry)
    append(kit.enqueue(tail_per_entry, body), full)
    if rest:
        append(kit.enqueue(rest, body), 1)
    storage.wal.close()  # the process stops here: no clean shutdown
    storage.cache.close()
    return Filled(machine, index, checkpoint_index, len(state))


def recover(directory: str, kit: Kit) -> tuple[dict[str, float], Machine, NodeStorage]:
    """Open and replay, timing each phase: the storage's (open, checkpoint load and
    check, reading the tail) and the machine's (restore, apply). The ``*_cpu_ms`` figures
    are this process's CPU time over the same spans, as the cores may be shared."""
    c0, t0 = time.process_time(), time.perf_counter()
    storage = NodeStorage.open(OsDisk(directory), DEFAULT_LIMITS)
    t1 = time.perf_counter()
    rec = storage.open_server(UID)
    assert rec.checkpoint is not None
    c2, t2 = time.process_time(), time.perf_counter()
    machine = kit.new()
    machine.restore(rec.checkpoint.state)  # type: ignore[arg-type]
    c3, t3 = time.process_time(), time.perf_counter()
    lo, last = rec.checkpoint.index + 1, rec.log.last_index()
    tail: list[Entry] = []
    while lo <= last:
        tail.extend(rec.log.entries(lo, last + 1, 16 << 20))
        lo = tail[-1].index + 1
    c4, t4 = time.process_time(), time.perf_counter()
    for e in tail:
        if e.kind == EntryKind.COMMAND:
            machine.apply(ApplyMeta(e.index, e.term, e.now_ms), e.data)
    c5, t5 = time.process_time(), time.perf_counter()
    times = {
        "recovery_ms": (t5 - t0) * 1000,
        "storage_ms": (t2 - t0 + t4 - t3) * 1000,
        "machine_ms": (t3 - t2 + t5 - t4) * 1000,
        "open_ms": (t1 - t0) * 1000,
        "checkpoint_load_ms": (t2 - t1) * 1000,
        "machine_restore_ms": (t3 - t2) * 1000,
        "tail_read_ms": (t4 - t3) * 1000,
        "tail_apply_ms": (t5 - t4) * 1000,
        "replayed_entries": len(tail),
        "recovery_cpu_ms": (c5 - c0) * 1000,
        "storage_cpu_ms": (c2 - c0 + c4 - c3) * 1000,
        "machine_cpu_ms": (c3 - c2 + c5 - c4) * 1000,
    }
    return {k: round(v, 1) for k, v in times.items()}, machine, storage


def main(argv: list[str]) -> int:
    parser = bench.parser("recovery", __doc__)
    parser.add_argument("--messages", type=int, default=100_000, help="before the checkpoint")
    parser.add_argument("--per-entry", type=int, default=100, help="messages per log entry")
    parser.add_argument("--tail", type=int, default=10_000, help="messages after it")
    parser.add_argument("--tail-per-entry", type=int, default=1, help="of the tail, per entry")
    parser.add_argument("--body-bytes", type=int, default=32, help="bytes per message body")
    parser.add_argument("--machine", choices=sorted(KITS), default="queue", help="machine kind")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.tail = QUICK_MESSAGES, QUICK_TAIL
    result = bench.header("recovery")
    kit = KITS[args.machine]
    root = Path(__file__).resolve().parent.parent
    directory = tempfile.mkdtemp(prefix=".bench-recovery-", dir=root)
    try:
        t = time.perf_counter()
        filled = fill(
            directory,
            kit,
            args.messages,
            args.per_entry,
            args.tail,
            args.tail_per_entry,
            b"m" * args.body_bytes,
        )
        fill_s = time.perf_counter() - t
        crash, machine, storage = recover(directory, kit)
        assert machine.snapshot() == filled.machine.snapshot(), "recovered state differs"
        storage.close()  # clean shutdown: WAL rolled, mem tables in segments
        clean, machine, storage = recover(directory, kit)
        assert machine.snapshot() == filled.machine.snapshot(), "recovered state differs"
        storage.close(flush=False)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    result |= {
        "machine_kind": args.machine,
        "messages": args.messages,
        "messages_per_entry": args.per_entry,
        "tail_messages": args.tail,
        "tail_messages_per_entry": args.tail_per_entry,
        "log_entries": filled.last_index,
        "checkpoint_bytes": filled.checkpoint_bytes,
        "fill_s": round(fill_s, 3),
        "recovery_ms": clean["recovery_ms"],
        "recovery_cpu_ms": clean["recovery_cpu_ms"],
        "clean_stop": clean,
        "crash_stop": crash,
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0
