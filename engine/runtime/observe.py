"""What a node reports about a queue replica: stats, segments, compaction records.

Rule: read-only functions of a ``Replica`` (and its storage log); nothing here changes
engine state, except the rate sample a stats call may add and the replica's cached live
set. Nothing here is proportional to a deep queue's depth on the caller's thread (the
event loop): the live set of a deep queue is built from a frozen machine on a worker.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pyroaring import BitMap64

from engine.errors import QuorraError
from engine.limits import DEFAULT_LIMITS, Limits
from engine.queue import PagingStats
from engine.queue.paging import NOT_PAGED, page_bytes
from engine.queue.snapshots import FrozenMachine
from engine.raft.server import Role
from engine.runtime.api import CompactionRecord, SegmentInfo, Trigger
from engine.runtime.replica import Replica, node_of
from engine.runtime.sleeping import MEMORY_FIELDS, Dormant, SummaryFields, summary_fields
from engine.storage.read_cache import ReadCacheStats

LIVE_SET_REUSE_S = 1.0
"""How long the live set behind stats, segments and records is reused while entries apply
(see ``live_indexes`` for what a reused set counts)."""
LIVE_SET_COST_FACTOR = 50
"""A live set that took ``t`` seconds to build is reused for ``LIVE_SET_COST_FACTOR * t``
when that is longer: building it is linear in the queue's depth, so a deep queue's stats
must not keep a core busy (about 0.1 s for 5 million messages: reused for 5 s, at most 2%
of a core)."""
LIVE_SET_INLINE_MAX = 65_536
"""A queue holding at most this many messages builds its live set on the caller's thread
(a millisecond or two). A deeper one freezes its machine (``QueueMachine.freeze``, in time
proportional to its pages, not its messages) and builds the set on a worker thread; until
that build is done, reads use the previous set (see ``live_indexes``)."""

_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


def live_indexes(rep: Replica) -> BitMap64:
    """The entries that may hold a message still in the queue: never fewer than those that
    do (see ``live_set``)."""
    return live_set(rep)[0]


def live_set(rep: Replica) -> tuple[BitMap64, int]:
    """``live_indexes`` and the applied index at which its set was built. The set is
    rebuilt at most every ``LIVE_SET_REUSE_S`` (longer for deep queues, see
    ``LIVE_SET_COST_FACTOR``), for a deep queue on a worker (``LIVE_SET_INLINE_MAX``);
    a restarted replica starts from its checkpoint's set (``seed_live_set``). In between,
    the set of the last build plus every entry applied since; with no set yet, every
    entry. An entry that held no message at the build never holds one again (a message
    stays in the entry that published it), so a reused set only counts as live, for that
    long, entries that died since or that never held a message."""
    dormant = rep.dormant
    if dormant is not None:  # a sleeping queue's, kept as it fell asleep
        return BitMap64.deserialize(dormant.live), dormant.applied_index
    _take_finished_build(rep)
    now = time.monotonic()
    cached = rep.live_cache
    if cached is not None and cached[0] is rep.machine:
        _, applied, built_at, live, cost = cached
        if applied == rep.applied_index:
            return live, applied
        reuse_s = max(LIVE_SET_REUSE_S, LIVE_SET_COST_FACTOR * cost)
        if now - built_at < reuse_s or _built_off_loop(rep):
            return _with_applied_since(live, applied, rep.applied_index), applied
    elif _built_off_loop(rep):
        return _every_entry(rep), 0
    live = rep.machine.live_indexes()
    rep.live_cache = (rep.machine, rep.applied_index, now, live, time.monotonic() - now)
    return live, rep.applied_index


def seed_live_set(rep: Replica, index: int, live: BitMap64) -> None:
    """The live set at ``index`` is ``live`` (a checkpoint's or a snapshot's, which the
    machine was just restored from): reads start from it instead of walking the queue."""
    rep.live_cache = (rep.machine, index, time.monotonic(), live, 0.0)
    rep.live_build = None


def _every_entry(rep: Replica) -> BitMap64:
    """Every entry the log holds up to the applied index: the set until one is built."""
    firsts = [info.lo for info, _hi in rep.log.segment_infos()]
    if len(rep.log.mem):
        firsts.append(rep.log.mem.lo)
    everything = BitMap64()
    if firsts and min(firsts) <= rep.applied_index:
        everything.add_range(min(firsts), rep.applied_index + 1)
    return everything


def _with_applied_since(live: BitMap64, applied: int, now_applied: int) -> BitMap64:
    since = live.copy()
    if now_applied > applied:
        since.add_range(applied + 1, now_applied + 1)
    return since


def _built_off_loop(rep: Replica) -> bool:
    """True when the set of a deep queue is being built on a worker (started now if no
    build runs); False for a queue shallow enough to build it here."""
    if rep.live_build is not None:
        return True
    if rep.machine.held() <= LIVE_SET_INLINE_MAX:
        return False
    frozen = rep.machine.freeze()
    rep.live_build = (rep.machine, rep.applied_index, _workers().submit(_timed_build, frozen))
    return True


def _workers() -> ThreadPoolExecutor:
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quorra-live-set")
        return _worker


def _timed_build(frozen: FrozenMachine) -> tuple[BitMap64, float]:
    started = time.monotonic()
    live = frozen.live_indexes()
    return live, time.monotonic() - started


def _take_finished_build(rep: Replica) -> None:
    """A build finished on the worker becomes the set reads use."""
    build = rep.live_build
    if build is None or not build[2].done():
        return
    rep.live_build = None
    machine, applied, future = build
    live, cost = future.result()
    cached = rep.live_cache
    if machine is rep.machine and (
        cached is None or cached[0] is not machine or cached[1] <= applied
    ):
        rep.live_cache = (machine, applied, time.monotonic(), live, cost)


def segment_totals(rep: Replica) -> tuple[int, int, int]:
    segs = segment_infos(rep, live_indexes(rep))
    return len(segs), sum(s.bytes for s in segs), sum(s.dead_entries for s in segs)


def compaction_record(
    rep: Replica,
    phase: str,
    trigger: Trigger,
    started_ms: int,
    duration_ms: float,
    before: tuple[int, int, int] | None,
) -> CompactionRecord:
    after = segment_totals(rep)
    before = before or after
    return CompactionRecord(
        queue=rep.name,
        phase=phase,
        trigger=trigger,
        started_at_ms=started_ms,
        duration_ms=round(duration_ms, 3),
        segments_before=before[0],
        segments_after=after[0],
        bytes_before=before[1],
        bytes_after=after[1],
        live_entries=len(live_indexes(rep)),
        dead_entries_before=before[2],
        dead_entries_after=after[2],
    )


def queue_summary(rep: Replica, now: int, limits: Limits) -> dict[str, object]:
    """The part of ``queue_stats`` read from the machine alone: counts, rates and memory,
    without the log's live set and segments. The dashboard's sampler reads it for every
    queue every 5 s: the whole stats of 10,000 queues took longer than that."""
    if rep.dormant is not None:  # rates zero; counts from its packed stats, no QueueStats
        f = summary_fields(rep.dormant.packed_stats)
        publish_rate = deliver_rate = ack_rate = 0.0
    else:
        s = rep.queue_stats()
        rep.sample(now, limits)
        publish_rate, deliver_rate, ack_rate = rep.rates(now, limits)
        memory = {name: getattr(s.memory, name) for name in MEMORY_FIELDS}
        f = SummaryFields(
            s.messages_ready,
            s.messages_unacked,
            s.bytes_ready,
            dict(s.consumers),
            s.memory_bytes,
            memory,
        )
    return {
        "messages_ready": f.messages_ready,
        "messages_unacked": f.messages_unacked,
        "bytes_ready": f.bytes_ready,
        "consumers": f.consumers,
        "publish_rate": publish_rate,
        "deliver_rate": deliver_rate,
        "ack_rate": ack_rate,
        "memory_bytes": f.memory_bytes,
        "memory": f.memory,
    }


def queue_stats(rep: Replica, now: int, limits: Limits) -> dict[str, object]:
    """The stats of API.md for one replica (a sleeping one's without waking it)."""
    s = rep.queue_stats()
    live, live_at = live_set(rep)
    segments = segment_infos(rep, live)
    rep.sample(now, limits)
    publish_rate, deliver_rate, ack_rate = rep.rates(now, limits)
    held = s.messages_ready + s.messages_unacked + s.messages_delayed
    memory = s.memory
    per_message = memory.total_bytes - memory.fixed_bytes
    return {
        "messages_ready": s.messages_ready,
        "messages_unacked": s.messages_unacked,
        "messages_delayed": s.messages_delayed,
        "messages_dead_lettering": s.messages_dead_lettering,
        "bytes_ready": s.bytes_ready,
        "bytes_unacked": s.bytes_unacked,
        "consumers": dict(s.consumers),
        "published": s.published,
        "delivered": s.delivered,
        "acked": s.acked,
        "dead_lettered": s.dead_lettered,
        "expired": s.expired,
        "dropped": s.dropped,
        "publish_rate": publish_rate,
        "deliver_rate": deliver_rate,
        "ack_rate": ack_rate,
        "memory_bytes": s.memory_bytes,
        "memory_per_message_bytes": round(per_message / held, 3) if held else 0.0,
        "memory": {name: getattr(memory, name) for name in MEMORY_FIELDS},
        "paging": paging_stats(s.paging, limits),
        "read_cache": read_cache_stats(rep),
        "raft": raft_stats(rep),
        "log": {**log_stats(rep, live, segments), "live_set_index": live_at},
        "checkpoint": {
            "index": rep.checkpoint.index,
            "taken_at": rep.checkpoint.taken_at_ms or None,
            "bytes": rep.checkpoint.bytes,
        },
        "status": "failed" if rep.failed is not None else "ok",
    }


def node_memory(
    replicas: list[Replica], pages_max: int, limits: Limits, cache: ReadCacheStats
) -> dict[str, object]:
    """The node's totals over its queues: engine memory (and its limit), pages of the
    ready indexes in memory (within the node's budget) and out, loads waited for, log
    reads from memory, and the node's read cache of segment blocks (``cache``)."""
    stats = [rep.queue_stats() for rep in replicas]
    counts = [rep.log_reads() for rep in replicas]  # a sleeping queue's log stays packed
    reads = sum(r for r, _ in counts)
    hits = sum(h for _, h in counts)
    resident = sum(s.paging.resident_pages for s in stats)
    return {
        "queues": len(replicas),
        "memory_bytes": sum(s.memory_bytes for s in stats),
        "memory_bytes_max": limits.engine_memory_bytes_max,
        "resident_pages": resident,
        "resident_bytes": resident * page_bytes(limits),
        "resident_pages_max": pages_max,
        "paged_out_pages": sum(s.paging.paged_out_pages for s in stats),
        "page_waits": sum(s.paging.page_waits for s in stats),
        "read_ahead_hits": sum(s.paging.read_ahead_hits for s in stats),
        "pages_rebuilt": sum(s.paging.pages_rebuilt for s in stats),
        "read_cache_hit_rate": round(hits / reads, 4) if reads else 1.0,
        "read_cache_bytes": cache.bytes,
        "read_cache_bytes_max": cache.bytes_max,
        "read_cache_blocks": cache.blocks,
        "read_cache_hits": cache.hits,
        "read_cache_misses": cache.misses,
        "read_cache_evictions": cache.evictions,
    }


def paging_stats(paging: PagingStats, limits: Limits) -> dict[str, object]:
    """The queue's paged ready index (``engine.queue.paging``): pages in memory and out,
    the loads read-ahead did in time (hits) and those a consumer waited for (waits)."""
    reached = paging.read_ahead_hits + paging.page_waits
    return {
        "resident_pages": paging.resident_pages,
        "resident_bytes": paging.resident_pages * page_bytes(limits),
        "paged_out_pages": paging.paged_out_pages,
        "page_writes": paging.page_writes,
        "page_loads": paging.page_loads,
        "read_ahead_hits": paging.read_ahead_hits,
        "page_waits": paging.page_waits,
        "read_ahead_hit_rate": round(paging.read_ahead_hits / reached, 4) if reached else 1.0,
        "pages_rebuilt": paging.pages_rebuilt,
        "page_write_failures": paging.page_write_failures,
    }


def read_cache_stats(rep: Replica) -> dict[str, object]:
    """The queue's payload reads from its log (deliveries, browsing, page rebuilds) since
    the node started, in entries: ``hits`` were served from memory, either the mem table
    (``mem_table_hits``: entries not yet flushed to a segment) or the node's read cache
    of segment blocks (``cache_hits``); ``misses`` were read from a segment file, by
    ``segment_reads`` reads (``pread``) of ``segment_bytes`` bytes in all (the blocks the
    cache keeps, the entries read ahead with them included)."""
    log = rep.log
    reads = log.reads
    hits = log.reads_in_memory + log.cache_hits
    return {
        "reads": reads,
        "hits": hits,
        "hit_rate": round(hits / reads, 4) if reads else 1.0,
        "mem_table_hits": log.reads_in_memory,
        "cache_hits": log.cache_hits,
        "misses": reads - hits,
        "segment_reads": log.segment_reads,
        "segment_bytes": log.segment_bytes,
    }


NO_READS: dict[str, object] = {
    "reads": 0,
    "hits": 0,
    "hit_rate": 1.0,
    "mem_table_hits": 0,
    "cache_hits": 0,
    "misses": 0,
    "segment_reads": 0,
    "segment_bytes": 0,
}
"""``read_cache_stats`` of a queue that read nothing."""


def raft_stats(rep: Replica) -> dict[str, object]:
    dormant = rep.dormant
    if dormant is not None:
        return sleeping_raft_stats(rep, dormant)
    raft = rep.raft
    last = raft.log.last_index()
    members = []
    for member in raft.config.members:
        role = "learner" if member in raft.config.learners else "follower"
        lag: int | None = None
        if member == raft.leader:
            role = "leader"
        if member == raft.id:
            lag = 0 if raft.role is Role.LEADER else None
        elif raft.role is Role.LEADER and member in raft.progress:
            lag = max(0, last - raft.progress[member].match)
        members.append({"node": node_of(member), "role": role, "lag": lag})
    return {
        "leader": node_of(raft.leader) if raft.leader else None,
        "role": raft.role.name.lower(),
        "term": raft.term,
        "commit_index": raft.commit,
        "last_applied": rep.applied_index,
        "members": members,
        "repairing": raft.repairing,
    }


def sleeping_raft_stats(rep: Replica, dormant: Dormant) -> dict[str, object]:
    """``raft_stats`` of a sleeping queue: a lone voter, which leads while it sleeps."""
    pos = dormant.record.raft
    assert pos is not None
    node = node_of(rep.server_id)
    return {
        "leader": node,
        "role": "leader",
        "term": pos.term,
        "commit_index": pos.commit,
        "last_applied": dormant.applied_index,
        "members": [{"node": node, "role": "leader", "lag": 0}],
        "repairing": False,
    }


def log_stats(rep: Replica, live: BitMap64, segs: list[SegmentInfo]) -> dict[str, object]:
    mem = rep.log.mem
    mem_live = live.range_cardinality(mem.lo, mem.hi + 1) if len(mem) else 0
    first = min([s.first_index for s in segs] + ([mem.lo] if len(mem) else []), default=0)
    return {
        "first_index": first,
        "last_index": rep.log.last_index(),
        "snapshot_index": rep.log.snapshot_index(),
        "segments": len(segs),
        "bytes": sum(s.bytes for s in segs),
        "live_entries": len(live),
        "dead_entries": sum(s.dead_entries for s in segs) + len(mem) - mem_live,
    }


def segment_infos(rep: Replica, live: BitMap64) -> list[SegmentInfo]:
    out = []
    for info, hi in rep.log.segment_infos():
        entries = min(info.count, hi - info.lo + 1)
        live_n = _live_in(live, info.lo, hi)
        out.append(
            SegmentInfo(
                name=info.path.rsplit("/", 1)[-1],
                first_index=info.lo,
                last_index=hi,
                bytes=info.bytes,
                live_entries=live_n,
                dead_entries=max(0, entries - live_n),
            )
        )
    return out


def _live_in(live: BitMap64, lo: int, hi: int) -> int:
    return int(live.range_cardinality(lo, hi + 1))


def failed_stats(error: QuorraError) -> dict[str, object]:
    """Stats of a queue whose recovery was refused: nothing is known but the reason."""
    counts = ("messages_ready", "messages_unacked", "bytes_ready", "memory_bytes")
    rates = ("publish_rate", "deliver_rate", "ack_rate", "memory_per_message_bytes")
    return {
        **dict.fromkeys(counts, 0),
        **dict.fromkeys(rates, 0.0),
        "consumers": {},
        "memory": dict.fromkeys(MEMORY_FIELDS, 0),
        "paging": paging_stats(NOT_PAGED, DEFAULT_LIMITS),
        "read_cache": dict(NO_READS),
        "raft": {
            "leader": None,
            "role": "none",
            "term": 0,
            "commit_index": 0,
            "last_applied": 0,
            "members": [],
            "repairing": False,
        },
        "log": {
            "first_index": 0,
            "last_index": 0,
            "snapshot_index": 0,
            "segments": 0,
            "bytes": 0,
            "live_entries": 0,
            "dead_entries": 0,
            "live_set_index": 0,
        },
        "checkpoint": {"index": 0, "taken_at": None, "bytes": 0},
        "status": "failed",
        "error": error.detail,
    }


__all__ = [
    "MEMORY_FIELDS",
    "NO_READS",
    "compaction_record",
    "failed_stats",
    "live_indexes",
    "live_set",
    "log_stats",
    "node_memory",
    "paging_stats",
    "queue_stats",
    "raft_stats",
    "read_cache_stats",
    "seed_live_set",
    "segment_infos",
    "segment_totals",
]
