"""Durable 1 KiB appends per second through the shared WAL from 1, 10 and 100 servers.

``quorra bench wal [--json] [--quick] [--servers 1,10,100] [--window W] [--seconds S]``:
the appends are compared with plain sequential 64 KiB writes + fdatasync on the same
disk.

Each server keeps ``--window`` entries in flight (a Raft leader pipelines its appends);
when a ``Persisted`` comes back it submits as many new entries, as one append, as it
has room for, building them as the Raft core does (one ``Entry`` each). The WAL runs in
its writer thread (``WalWriter``) exactly as in the runtime; batches are applied and
servers refilled on the main thread. WAL rolls and segment flushes happen as they would
(the flush runs in a worker thread). Data goes to a temporary directory next to the
repository (same disk), removed afterwards. MB here are 10^6 bytes.

The default window, 16 entries per server (1.6 MB in flight for 100 servers of 1 KiB
entries), is two batches' worth: while the writer syncs one batch the servers refill
from the previous one, as a loaded leader keeps taking proposals while its last append
syncs. With 8 the whole window of every server fits in one batch and the writer waits
for the refills after each sync (``--window 8`` shows it). Either is light pipelining
for Raft: the core lets a leader keep
``inflight_messages_per_follower_max`` (64) appends of up to
``append_entries_per_message_max`` (512) entries in flight to each follower, so a
follower may have far more entries waiting for its WAL, and a leader's own appends are
bounded only by ``uncommitted_bytes_max``. A window above 64 x 512 is refused.

The disk is shared with whatever else runs, so each run is compared with the mean of
raw figures measured just before and just after it (``raw_mb_per_s`` of the run; the
top-level one is the first run's).
Each run also reports the 1-minute load average when it started and the CPU time of the
whole process (all threads) per entry, which noise from other processes moves less than
the throughput. ``--quick``: 1 and 10 servers, 0.3 s per run.

JSON keys (``JSON_KEYS``), the headline being ``entries_per_s``:

* ``bench``: "wal";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``entry_bytes``: bytes per entry (``--entry-bytes``);
* ``window_entries_per_server``: entries in flight per server (``--window``);
* ``seconds_per_run``: length of each run and of each raw measurement;
* ``raw_write_bytes``: bytes per raw write (64 KiB);
* ``raw_mb_per_s``: raw writes + fdatasync, MB/s, around the first run;
* ``entries_per_s``: the headline: durable entries per second at the largest number of
  servers measured (100 by default);
* ``entries_per_s_by_servers``: the same for each number of servers;
* ``runs``: each run's figures (``mb_per_s``, ``mb_per_s_vs_raw``, fsyncs, CPU, load).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

import bench
from engine.limits import DEFAULT_LIMITS
from engine.raft.entry import Entry, EntryKind
from engine.runtime.wal_writer import WalWriter
from engine.storage import NodeStorage, OsDisk, Persisted, SegmentFlush, WalBatch
from engine.storage.wal import AppendOp

JSON_KEYS = (
    "bench",
    "machine",
    "entry_bytes",
    "window_entries_per_server",
    "seconds_per_run",
    "raw_write_bytes",
    "raw_mb_per_s",
    "entries_per_s",
    "entries_per_s_by_servers",
    "runs",
)
HEADLINE_KEY = "entries_per_s"
MB = 1_000_000
RAW_CHUNK = 64 * 1024
QUICK_SERVERS = "1,10"
QUICK_SECONDS = 0.3


def _bench_dir() -> str:
    root = Path(__file__).resolve().parent.parent
    return tempfile.mkdtemp(prefix=".bench-wal-", dir=root)


def raw_mb_per_s(directory: str, seconds: float) -> float:
    """Plain sequential 64 KiB writes, each followed by fdatasync."""
    chunk = os.urandom(RAW_CHUNK)
    path = os.path.join(directory, "raw.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.write(fd, chunk)
            os.fdatasync(fd)
            written += RAW_CHUNK
    finally:
        os.close(fd)
        os.remove(path)
    return written / (time.perf_counter() - start) / MB


def run_servers(
    directory: str, servers: int, window: int, entry_bytes: int, seconds: float
) -> dict[str, Any]:
    storage = NodeStorage.open(OsDisk(directory), DEFAULT_LIMITS)
    uids = [f"q{k:04d}" for k in range(servers)]
    for uid in uids:
        storage.open_server(uid)
    payload = os.urandom(entry_bytes)
    # The fields every entry shares, for building a refill in one call as a leader would.
    ones, commands, zeros, payloads = (
        repeat(1),
        repeat(EntryKind.COMMAND),
        repeat(0),
        repeat(payload),
    )
    inbox: queue.SimpleQueue[WalBatch] = queue.SimpleQueue()
    writer = WalWriter(storage.wal, inbox.put)
    next_index = dict.fromkeys(uids, 1)
    inflight = dict.fromkeys(uids, 0)
    pool = ThreadPoolExecutor(max_workers=1)
    flushing: Future[None] | None = None
    flush: SegmentFlush | None = None

    def refill(uid: str) -> None:
        n = window - inflight[uid]
        if n <= 0:
            return
        first = next_index[uid]
        entries = tuple(map(Entry, range(first, first + n), ones, commands, zeros, payloads))
        next_index[uid] = first + n
        inflight[uid] += n
        storage.wal.submit(AppendOp(uid, entries))  # wakes the writer if it is idle

    writer.start()
    load = os.getloadavg()[0]
    cpu_start = time.process_time()
    syncs_before = storage.wal.times.batches
    persisted = 0
    start = time.perf_counter()
    for uid in uids:
        refill(uid)
    while (elapsed := time.perf_counter() - start) < seconds:
        for event in storage.complete(inbox.get()):
            assert isinstance(event, Persisted), event
            done = event.index - (next_index[event.uid] - inflight[event.uid]) + 1
            inflight[event.uid] -= done
            persisted += done
            refill(event.uid)
        if flushing is not None and flushing.done():
            flushing.result()
            assert flush is not None
            storage.finish_segment_flush(flush)
            flushing = None
        if flushing is None and (flush := storage.prepare_segment_flush()) is not None:
            flushing = pool.submit(flush.write)
    syncs = storage.wal.times.batches - syncs_before
    writer.stop()
    while not inbox.empty():
        storage.complete(inbox.get())
    if flushing is not None:
        flushing.result()
    pool.shutdown()
    storage.wal.close()
    storage.cache.close()
    cpu_s = time.process_time() - cpu_start
    return {
        "servers": servers,
        "window_entries_per_server": window,
        "load_1min": round(load, 2),
        "cpu_us_per_entry": round(cpu_s / max(persisted, 1) * 1e6, 2),
        "entries_per_s": round(persisted / elapsed),
        "mb_per_s": round(persisted * entry_bytes / elapsed / MB, 1),
        "fsyncs_per_s": round(syncs / elapsed, 1),
        "entries_per_fsync": round(persisted / max(syncs, 1), 1),
    }


def main(argv: list[str]) -> int:
    parser = bench.parser("wal", __doc__)
    parser.add_argument("--servers", default="1,10,100", help="comma-separated server counts")
    parser.add_argument("--window", type=int, default=16, help="entries in flight per server")
    parser.add_argument("--entry-bytes", type=int, default=1024, help="bytes per entry")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    args = parser.parse_args(argv)
    if args.quick:
        args.servers, args.seconds = QUICK_SERVERS, QUICK_SECONDS
    limits = DEFAULT_LIMITS
    window_max = limits.inflight_messages_per_follower_max * limits.append_entries_per_message_max
    if not 1 <= args.window <= window_max:
        parser.error(f"--window must be 1..{window_max} (what the Raft core lets be in flight)")
    counts = [int(s) for s in args.servers.split(",")]
    result = bench.header("wal") | {
        "entry_bytes": args.entry_bytes,
        "window_entries_per_server": args.window,
        "seconds_per_run": args.seconds,
        "raw_write_bytes": RAW_CHUNK,
    }
    runs = measure(counts, args.window, args.entry_bytes, args.seconds)
    by_servers = {str(run["servers"]): run["entries_per_s"] for run in runs}
    result |= {
        "raw_mb_per_s": runs[0]["raw_mb_per_s"],
        "entries_per_s": by_servers[str(max(counts))],
        "entries_per_s_by_servers": by_servers,
        "runs": runs,
    }
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def measure(counts: list[int], window: int, entry_bytes: int, seconds: float) -> list[Any]:
    """One run per server count, each beside the raw figures measured just before and
    after it."""
    directory = _bench_dir()
    runs = []
    try:
        before = raw_mb_per_s(directory, seconds)
        for servers in counts:
            run_dir = os.path.join(directory, f"servers-{servers}")
            run = run_servers(run_dir, servers, window, entry_bytes, seconds)
            shutil.rmtree(run_dir)
            after = raw_mb_per_s(directory, seconds)
            raw = (before + after) / 2
            run["raw_mb_per_s"] = round(raw, 1)
            run["raw_mb_per_s_before_after"] = [round(before, 1), round(after, 1)]
            run["mb_per_s_vs_raw"] = round(run["mb_per_s"] / raw, 2) if raw else None
            runs.append(run)
            before = after
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return runs
