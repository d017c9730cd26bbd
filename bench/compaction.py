"""How much disk compaction gives back, and what it costs publishers meanwhile.

``quorra bench compaction [--json] [--quick] [--messages N] [--body-bytes B]``: publish
``--messages`` messages of ``--body-bytes`` over 4 priorities to one queue (one log entry
each, through ``engine.queue.QueueMachine`` and the real storage on this disk), check
them all out, ack 90% of them in random order, stop cleanly (every entry is in a
segment), take a checkpoint, compact (``auto``). Meanwhile and before, one-message
publishes to a second queue on the same node, durable (group commit of 100 entries),
are timed alone and while the compaction's I/O runs in a worker thread, as the runtime
runs it. Data goes to a temporary directory in the repository (its disk), removed at
the end. ``--quick``: 20,000 messages, the idle publish rate over 0.5 s.

JSON keys (``JSON_KEYS``), the headline being ``ratio_after``:

* ``bench``: "compaction";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``messages``: messages published (``--messages``);
* ``body_bytes``: bytes per message body (``--body-bytes``);
* ``publish_s``: time to publish them (not part of the compaction);
* ``live_entries``: log entries the checkpoint still needs;
* ``live_bytes``: bytes of those entries (their data);
* ``disk_bytes_before``: the queue's segment files before compaction (the WAL is empty
  after the clean stop);
* ``disk_bytes_after``: the same after compaction;
* ``ratio_after``: the headline: ``disk_bytes_after / live_bytes`` (target at most 1.3);
* ``compaction_s``: the compaction's wall time;
* ``compaction_io_s``: the part spent in the worker thread;
* ``phases``: the compaction's phases;
* ``segments_before``: segment files before;
* ``segments_after``: segment files after;
* ``dead_entries_before``: dead entries in segments before;
* ``dead_entries_after``: dead entries in segments after;
* ``transient_bytes_max``: the most extra disk the compaction used at once;
* ``publish_rate_idle``: publishes per second to the second queue, alone;
* ``publish_rate_during``: the same during the compaction;
* ``publish_ratio``: during / idle (target at least 0.5);
* ``targets``: ``ratio_after_max`` and ``publish_ratio_min``.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench
from engine.limits import DEFAULT_LIMITS
from engine.queue import NewMessage, QueuePolicy, encode_checkout, encode_enqueue, encode_settle
from engine.queue.effects import CheckedOut
from engine.queue.machine import QueueMachine
from engine.raft.entry import Entry, EntryKind
from engine.raft.state_machine import ApplyMeta
from engine.storage import Checkpoint, NodeStorage, OsDisk

JSON_KEYS = (
    "bench",
    "machine",
    "messages",
    "body_bytes",
    "publish_s",
    "live_entries",
    "live_bytes",
    "disk_bytes_before",
    "disk_bytes_after",
    "ratio_after",
    "compaction_s",
    "compaction_io_s",
    "phases",
    "segments_before",
    "segments_after",
    "dead_entries_before",
    "dead_entries_after",
    "transient_bytes_max",
    "publish_rate_idle",
    "publish_rate_during",
    "publish_ratio",
    "targets",
)
HEADLINE_KEY = "ratio_after"
QUICK_MESSAGES = 20_000
QUICK_IDLE_S = 0.5
QUEUE = "bench-compaction"
OTHER = "bench-publish"
PRIORITIES = 4


class Queue:
    """One queue machine whose commands are appended to the storage, one entry each."""

    def __init__(self, storage: NodeStorage, uid: str) -> None:
        self.storage = storage
        self.uid = uid
        self.machine = QueueMachine(QueuePolicy(priorities=PRIORITIES, delivery_limit=None))
        self.index = storage.log(uid).last_index()
        self.pending: list[Entry] = []

    def command(self, data: bytes) -> object:
        self.index += 1
        now = 1_000 + self.index
        self.pending.append(Entry(self.index, 1, EntryKind.COMMAND, now, data))
        reply, _ = self.machine.apply(ApplyMeta(self.index, 1, now), data)
        return reply

    def commit(self) -> None:
        """Group commit of what is pending (one write + fdatasync)."""
        if self.pending:
            self.storage.append(self.uid, self.pending)
            self.pending = []
        self.storage.sync()


def fill(queue: Queue, messages: int, body: bytes, rng: random.Random) -> None:
    for k in range(messages):
        queue.command(encode_enqueue([NewMessage(body, priority=rng.randrange(PRIORITIES))]))
        if k % 1000 == 999:
            queue.commit()
    queue.commit()


def consume(queue: Queue, messages: int, ack_fraction: float, rng: random.Random) -> None:
    leased: list[tuple[int, int]] = []
    while len(leased) < messages:
        reply = queue.command(encode_checkout("bench", 1000, 3_600_000))
        assert isinstance(reply, CheckedOut) and reply.tags
        leased.extend(zip(reply.tags, reply.refs, strict=True))
    queue.commit()
    rng.shuffle(leased)
    acked = leased[: int(len(leased) * ack_fraction)]
    for at in range(0, len(acked), 1000):
        queue.command(encode_settle(acked[at : at + 1000]))
        if at % 100_000 == 0:
            queue.commit()
    queue.commit()


def publish_for(queue: Queue, body: bytes, seconds: float, stop: threading.Event | None) -> float:
    """Publishes per second, each durable in a group commit of 100."""
    n = 0
    start = time.perf_counter()
    while True:
        for _ in range(100):
            queue.command(encode_enqueue([NewMessage(body)]))
        queue.commit()
        n += 100
        elapsed = time.perf_counter() - start
        if (stop is not None and stop.is_set()) or (stop is None and elapsed >= seconds):
            return n / elapsed


def segment_bytes(directory: str, uid: str) -> int:
    seg = Path(directory) / "queues" / uid / "segments"
    return sum(p.stat().st_size for p in seg.iterdir() if p.name.endswith(".seg"))


def run(directory: str, messages: int, body_bytes: int, seed: int, idle_s: float) -> dict[str, Any]:
    rng = random.Random(seed)
    body = rng.randbytes(body_bytes)
    storage = NodeStorage.open(OsDisk(directory), DEFAULT_LIMITS)
    storage.open_server(QUEUE)
    storage.open_server(OTHER)
    queue = Queue(storage, QUEUE)
    t = time.perf_counter()
    fill(queue, messages, body, rng)
    publish_s = time.perf_counter() - t
    consume(queue, messages, 0.9, rng)
    storage.close()  # clean stop: every entry reaches a segment, the WAL is empty

    storage = NodeStorage.open(OsDisk(directory), DEFAULT_LIMITS)
    storage.open_server(QUEUE)
    storage.open_server(OTHER)
    queue.storage = storage
    live = queue.machine.live_indexes()
    cp = Checkpoint(queue.index, 1, QueueMachine.version, b"", live, queue.machine.snapshot())
    storage.write_checkpoint(QUEUE, cp)
    log = storage.log(QUEUE)
    live_bytes = sum(len(log.read(i).data) for i in live)
    before = segment_bytes(directory, QUEUE)
    other = Queue(storage, OTHER)
    idle_rate = publish_for(other, body, idle_s, None)

    t = time.perf_counter()
    job = storage.prepare_compaction(QUEUE, "auto")
    done = threading.Event()

    def work() -> None:
        try:
            job.run()
        finally:
            done.set()

    worker = threading.Thread(target=work)
    worker.start()
    during_rate = publish_for(other, body, 0.0, done)
    worker.join()
    result = storage.finish_compaction(job)
    compaction_s = time.perf_counter() - t
    after = segment_bytes(directory, QUEUE)
    for index in list(live)[:: max(1, len(live) // 1000)]:
        assert log.read(index).data, index  # spot check: live entries still read
    storage.close()
    return {
        "messages": messages,
        "body_bytes": body_bytes,
        "publish_s": round(publish_s, 3),
        "live_entries": len(live),
        "live_bytes": live_bytes,
        "disk_bytes_before": before,
        "disk_bytes_after": after,
        "ratio_after": round(after / live_bytes, 4) if live_bytes else None,
        "compaction_s": round(compaction_s, 3),
        "compaction_io_s": round(result.duration_s, 3),
        "phases": list(result.phases),
        "segments_before": result.segments_before,
        "segments_after": result.segments_after,
        "dead_entries_before": result.dead_entries_before,
        "dead_entries_after": result.dead_entries_after,
        "transient_bytes_max": result.transient_bytes_max,
        "publish_rate_idle": round(idle_rate, 1),
        "publish_rate_during": round(during_rate, 1),
        "publish_ratio": round(during_rate / idle_rate, 3),
        "targets": {"ratio_after_max": 1.3, "publish_ratio_min": 0.5},
    }


def main(argv: list[str]) -> int:
    parser = bench.parser("compaction", __doc__)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to publish")
    parser.add_argument("--body-bytes", type=int, default=1024, help="bytes per message body")
    parser.add_argument("--seed", type=int, default=1, help="seed of priorities, acks, bodies")
    parser.add_argument(
        "--idle-seconds", type=float, default=3.0, help="time to measure the idle publish rate"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.idle_seconds = QUICK_MESSAGES, QUICK_IDLE_S
    figures = bench.header("compaction")
    root = Path(__file__).resolve().parent.parent
    directory = tempfile.mkdtemp(prefix=".bench-compaction-", dir=root)
    try:
        figures |= run(directory, args.messages, args.body_bytes, args.seed, args.idle_seconds)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0
