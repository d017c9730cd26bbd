"""Compaction of one server's log before its snapshot (hybrid machines, seed
``ra-log-compaction-hybrid-machines.txt``).

A snapshot is the checkpoint plus the live entries before it: at or before the snapshot
index only the entries named by the snapshot's live-index set matter, every other one is
dead. Compaction reclaims dead entries in phases, cheapest first, and in ``auto`` stops
as soon as dead entries are at most ``compaction_dead_per_100_live_max`` per 100 live
ones (entries after the snapshot are the active log and are not counted):

1. delete segment files holding no live entry (the newest checkpoint is promoted to the
   snapshot first, which deletes what it already can). Always runs: it only deletes.
2. cut dead entries off a segment's end: the next header generation (smaller ``count``
   and ``hi``) goes to the other header slot and is synced, then the file is truncated
   and synced. A crash before the header sync leaves the old header; after it, the new
   header with bytes left past the last row, which the next phase 2 truncates.
3. rewrite runs of consecutive sparse segments (more dead than the ratio allows) into
   one segment of their live entries, bounded by ``segment_entries_max`` and
   ``segment_file_bytes_max`` (the plan estimates sizes; the rewrite stops taking inputs
   at the exact bound). Transient extra disk: one output at a time, so at most
   ``segment_file_bytes_max`` of data + 48 bytes per entry + 128 bytes of header beyond
   the inputs (plus inputs kept alive by readers until they release them).

Live data is not moved within a segment into its holes (the seed's optional 2b): a single
sparse segment is instead rewritten whole by phase 3, which needs no in-place update of a
file that readers may have open.

Crash safety of phase 3: an intent file ``segments/<out seq>.cmp`` naming the output and
its inputs is written durably first, then the output segment (temporary name, sync,
rename, directory sync), then the inputs are deleted, then the intent. At recovery
(``recover_intents``, before segments are loaded) an intent whose output is complete and
checks out rolls forward (the remaining inputs are deleted), otherwise rolls back (the
output is deleted); the intent is deleted either way. Nothing is lost and no file is left
that the log view does not use.

Readers and writers: the log view changes only on the node's thread, between reads. A
reader that uses segments across steps or from another thread (follower catch-up,
browse, a payload read in a worker) takes a ``PinnedReader``: its segments are
reference-counted in ``SegmentPins`` and a file leaving the view (phases 1 and 3, an
overwrite by the segment writer, a snapshot install) is deleted only when the last pin
is released (``reaper.py``); until then the reader reads the old file, which nothing
changes. Phase 2, the only change in place, skips pinned segments. A compaction job pins
what it works on, one job runs per server at a time, and the segment writer only creates
files under fresh seqs (reserved on the node's thread, as are the outputs of phase 3):
the writer and compaction never work on the same file.

The segment writer (``NodeStorage.prepare_segment_flush``) leaves out entries at or
before the snapshot that are not in its live set: an entry that died before its flush
is never written to a segment.

Rule: ``NodeStorage.prepare_compaction`` and ``finish_compaction`` run on the node's
thread; ``CompactionJob.run`` does the I/O of phases 2 and 3 and may run in a worker: it
touches only pinned files and files it creates under seqs reserved for it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import crc32c
import numpy as np
from pyroaring import AbstractBitMap64, BitMap64

from engine.errors import EntryDamaged, StorageFailed
from engine.index_sets import index_set
from engine.limits import MIB, Limits
from engine.raft.entry import Entry
from engine.storage.disk import Disk, parent, write_file_atomic
from engine.storage.segment import (
    COMPACTED,
    INDEX_DTYPE,
    ReaderCache,
    SegmentInfo,
    SegmentReader,
    encode_header,
    encode_segment,
    read_segment_info,
    segment_dir,
    segment_path,
    slot_offset,
)
from engine.storage.server_log import ServerLog

Phase = Literal["auto", 1, 2, 3]

SYNC_BYTES = 4 * MIB
"""Phase 3 syncs its output every this many bytes (see ``write_paced``)."""
_INTENT_MAGIC = b"QCMP"
_INTENT_HEAD = struct.Struct("<4sIQI")


# --- what a segment holds ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentStat:
    """One segment of the view, counted against the snapshot's live set."""

    info: SegmentInfo
    hi: int
    """The last index the segment answers for (a newer overwrite may hide the rest)."""
    rows: int
    """Entries it holds up to ``hi``."""
    live: int
    """Live entries at or before the snapshot."""
    dead: int
    """Dead entries at or before the snapshot."""
    active: int
    """Entries after the snapshot (the active log)."""
    dead_tail: int
    """Rows past its last live row, all dead (phase 2 can cut them); 0 if the segment
    reaches past the snapshot."""
    loose_bytes: int = 0
    """Bytes past its last row's data: left by a crash between a cut's header and its
    truncation (only a segment cut before can have them; phase 2 truncates them)."""

    @property
    def name(self) -> str:
        return self.info.path.rsplit("/", 1)[-1]


def segment_stat(
    cache: ReaderCache, info: SegmentInfo, hi: int, snap: int, live: AbstractBitMap64
) -> SegmentStat:
    """Count one segment; reads its index section only if it is sparse."""
    top = min(hi, snap)
    if info.count == info.hi - info.lo + 1:
        rows = hi - info.lo + 1
        area = max(0, top - info.lo + 1)
        live_n = int(live.range_cardinality(info.lo, top + 1)) if area else 0
        last_row = info.hi
    else:
        held = cache.get(info).index["index"]
        rows = int(np.searchsorted(held, hi, side="right"))
        area = int(np.searchsorted(held, top, side="right"))
        mine = index_set(held[:area]) if area else BitMap64()
        live_n = int(live.intersection_cardinality(mine)) if area else 0
        last_row = int(held[-1])
    dead_tail = 0
    if hi <= snap and live_n:
        last_live = int(live[int(live.rank(top)) - 1])
        if info.count == info.hi - info.lo + 1:
            dead_tail = last_row - last_live
        else:
            held = cache.get(info).index["index"]
            dead_tail = info.count - int(np.searchsorted(held, last_live, side="right"))
    loose = 0
    if info.generation > 1 and hi <= snap:
        last = cache.get(info).index[-1]
        loose = info.bytes - (int(last["offset"]) + int(last["length"]))
    return SegmentStat(info, hi, rows, live_n, area - live_n, rows - area, dead_tail, loose)


def log_stats(log: ServerLog, cache: ReaderCache) -> list[SegmentStat]:
    snap, live = log.snapshot_index(), log.snapshot_live
    return [segment_stat(cache, info, hi, snap, live) for info, hi in log.segment_infos()]


def within_ratio(dead: int, live: int, limits: Limits) -> bool:
    return dead * 100 <= limits.compaction_dead_per_100_live_max * live


# --- the job ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionResult:
    uid: str
    phases: tuple[int, ...]
    """The phases that changed something, in order."""
    snapshot_index: int
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    live_entries: int
    """Live entries at or before the snapshot, held in segments."""
    dead_entries_before: int
    dead_entries_after: int
    duration_s: float
    transient_bytes_max: int
    """The largest output segment phase 3 held at once beside its inputs."""
    deferred_files: int
    """Files out of the view but kept until their readers release them."""


@dataclass(slots=True)
class _Cut:
    stat: SegmentStat
    new: SegmentInfo | None = None


@dataclass(slots=True)
class _Group:
    out_seq: int
    inputs: list[SegmentStat]
    """Planned (and pinned)."""
    used: list[SegmentStat] = field(default_factory=list)
    """The inputs the output was made from: a prefix of ``inputs``."""
    output: SegmentInfo | None = None


@dataclass(slots=True)
class CompactionJob:
    """Phases 2 and 3 of one compaction, planned on the node's thread."""

    disk: Disk
    limits: Limits
    uid: str
    generation: int
    snap: int
    live: AbstractBitMap64
    before: list[SegmentStat]
    deletes: list[SegmentStat]
    cuts: list[_Cut]
    groups: list[_Group]
    started: float
    promoted: bool
    error: StorageFailed | None = None
    transient_bytes_max: int = 0

    def pinned_paths(self) -> list[str]:
        return [c.stat.info.path for c in self.cuts] + [
            s.info.path for g in self.groups for s in g.inputs
        ]

    def run(self) -> None:
        """The I/O of phases 2 and 3 (may run in a worker). A disk error stops it;
        what completed stays valid, the rest is undone or left to recovery."""
        try:
            for cut in self.cuts:
                cut.new = cut_dead_tail(self.disk, cut.stat, self.live)
            for group in self.groups:
                group.output = self._rewrite(group)
        except OSError as exc:
            self.error = StorageFailed(f"compaction of {self.uid} failed: {exc}")
        except StorageFailed as exc:  # a segment failed its check: leave it as it is
            self.error = exc

    def _rewrite(self, group: _Group) -> SegmentInfo:
        """Read the live entries of the group's inputs (as many inputs as fit in one
        segment: the plan's sizes are estimates), write the intent naming exactly those
        inputs, then the output."""
        entries: list[Entry] = []
        size = 0
        for stat in group.inputs:
            more = _live_entries(self.disk, stat, self.live)
            extra = sum(len(e.data) for e in more)
            if group.used and (
                size + extra > self.limits.segment_file_bytes_max
                or len(entries) + len(more) > self.limits.segment_entries_max
            ):
                break
            entries.extend(more)
            size += extra
            group.used.append(stat)
        assert entries, "a phase-3 group holds live entries"
        path = segment_path(self.uid, group.out_seq)
        intent = intent_path(self.uid, group.out_seq)
        seqs = [s.info.seq for s in group.used]
        write_file_atomic(self.disk, intent, encode_intent(group.out_seq, seqs))
        try:
            data = encode_segment(group.out_seq, entries, COMPACTED)
            write_paced(self.disk, path, data, SYNC_BYTES)
            info = read_segment_info(self.disk, path)
            assert info is not None, f"segment {path} unreadable right after writing"
        except OSError:
            for leftover in (path + ".tmp", path, intent):
                with contextlib.suppress(OSError):
                    if self.disk.exists(leftover):
                        self.disk.remove(leftover)
            raise
        self.transient_bytes_max = max(self.transient_bytes_max, info.bytes)
        return info


def write_paced(disk: Disk, path: str, data: bytes, sync_bytes: int) -> None:
    """``write_file_atomic`` with a sync every ``sync_bytes``: the output of phase 3
    reaches the disk in steps, so the WAL's group commits are not queued behind one
    large writeback."""
    tmp = path + ".tmp"
    f = disk.open(tmp, create=True)
    try:
        f.truncate(0)
        view = memoryview(data)
        for at in range(0, len(data), sync_bytes):
            f.append(bytes(view[at : at + sync_bytes]))
            f.sync()
    finally:
        f.close()
    disk.rename(tmp, path)
    disk.sync_dir(parent(path))


def _live_entries(disk: Disk, stat: SegmentStat, live: AbstractBitMap64) -> list[Entry]:
    reader = SegmentReader(disk, stat.info)
    try:
        wanted = live[live.rank(stat.info.lo - 1) : live.rank(stat.hi)]
        out = []
        for index in wanted:
            entry = reader.read(index)
            assert entry is not None, f"live entry {index} missing from {stat.info.path}"
            out.append(entry)
        return out
    finally:
        reader.close()


def cut_dead_tail(disk: Disk, stat: SegmentStat, live: AbstractBitMap64) -> SegmentInfo:
    """Phase 2 on one segment: keep the rows up to its last live one (header in the
    other slot, sync, truncate, sync), or only truncate loose bytes."""
    info = stat.info
    f = disk.open(info.path)
    try:
        raw = f.pread(info.index_offset, info.count * INDEX_DTYPE.itemsize)
        if crc32c.crc32c(raw) != info.index_crc:
            raise EntryDamaged(
                f"segment {info.path}: index section fails its CRC32C check", index=info.lo
            )
        rows = np.frombuffer(raw, dtype=INDEX_DTYPE)
        keep = info.count - stat.dead_tail
        assert 1 <= keep <= info.count
        end = int(rows["offset"][keep - 1]) + int(rows["length"][keep - 1])
        if keep == info.count:  # only loose bytes past the last row
            f.truncate(end)
            f.sync()
            return _reread(disk, info.path)
        assert int(rows["index"][keep - 1]) in live
        generation = info.generation + 1
        head = encode_header(
            info.seq,
            info.flags,
            keep,
            info.lo,
            int(rows["index"][keep - 1]),
            info.data_offset,
            raw[: keep * INDEX_DTYPE.itemsize],
            generation,
        )
        f.pwrite(slot_offset(generation), head)
        f.sync()
        f.truncate(end)
        f.sync()
    finally:
        f.close()
    new = _reread(disk, info.path)
    assert new.generation == generation and new.count == keep
    return new


def _reread(disk: Disk, path: str) -> SegmentInfo:
    info = read_segment_info(disk, path)
    assert info is not None, f"segment {path} unreadable after a cut"
    return info


# --- planning -----------------------------------------------------------------------------


def plan_phases(
    stats: list[SegmentStat],
    phase: Phase,
    limits: Limits,
    pinned: Callable[[str], bool],
) -> tuple[list[SegmentStat], list[SegmentStat], list[list[SegmentStat]]]:
    """What each phase will do: (deletions, tail cuts, rewrite groups), cheapest first,
    ``auto`` stopping once the ratio holds. Pure but for ``pinned``."""
    live = sum(s.live for s in stats)
    dead = sum(s.dead for s in stats)
    deletes = [s for s in stats if s.live == 0 and s.active == 0 and s.rows > 0]
    if phase not in ("auto", 1):
        deletes = []
    dead -= sum(s.dead for s in deletes)
    cuts: list[SegmentStat] = []
    if phase in ("auto", 2):
        # Loose bytes are a repair, never a trade-off: always taken.
        cuts = [s for s in stats if s.loose_bytes > 0 and not s.dead_tail]
        cuts = [s for s in cuts if s not in deletes and not pinned(s.info.path)]
        for s in sorted(stats, key=lambda s: (-s.dead_tail, s.info.seq)):
            if phase == "auto" and within_ratio(dead, live, limits):
                break
            if s.dead_tail and s not in deletes and not pinned(s.info.path):
                cuts.append(s)
                dead -= s.dead_tail
    groups: list[list[SegmentStat]] = []
    if phase in ("auto", 3):
        # Dead entries left once phase 2 has run: a cut segment may still be sparse.
        left = {s.info.path: s.dead - (s.dead_tail if s in cuts else 0) for s in stats}
        for group in sorted(
            _sparse_runs(stats, left, limits),
            key=lambda g: (-sum(left[s.info.path] for s in g), g[0].info.lo),
        ):
            if phase == "auto" and within_ratio(dead, live, limits):
                break
            groups.append(group)
            dead -= sum(left[s.info.path] for s in group)
        # A segment rewritten whole needs no cut first.
        rewritten = {s.info.path for g in groups for s in g}
        cuts = [c for c in cuts if c.info.path not in rewritten]
    return deletes, cuts, groups


def _sparse_runs(
    stats: list[SegmentStat],
    dead: dict[str, int],
    limits: Limits,
) -> list[list[SegmentStat]]:
    """Runs of segments, consecutive in the view, each over the ratio, wholly before the
    snapshot, holding together at most one segment's worth of live entries."""
    runs: list[list[SegmentStat]] = []
    run: list[SegmentStat] = []
    run_live = 0
    run_bytes = 0
    for s in stats:
        fits = (
            s.active == 0
            and s.live > 0
            and dead[s.info.path] > 0
            and not within_ratio(dead[s.info.path], s.live, limits)
        )
        live_bytes = _live_bytes_bound(s)
        if run and (
            not fits
            or run_live + s.live > limits.segment_entries_max
            or run_bytes + live_bytes > limits.segment_file_bytes_max
        ):
            runs.append(run)
            run, run_live, run_bytes = [], 0, 0
        if fits:
            run.append(s)
            run_live += s.live
            run_bytes += live_bytes
    if run:
        runs.append(run)
    return runs


def _live_bytes_bound(s: SegmentStat) -> int:
    """A segment's live data bytes, estimated without reading it: its data section in
    proportion to its live rows (rounded up)."""
    data = s.info.bytes - s.info.data_offset
    return min(data, -(-data * s.live // max(1, s.info.count)))


# --- intents ------------------------------------------------------------------------------


INTENT_SUFFIX = ".cmp"
"""How an intent file's name ends."""


def intent_path(uid: str, out_seq: int) -> str:
    return f"{segment_dir(uid)}/{out_seq:08d}{INTENT_SUFFIX}"


def encode_intent(out_seq: int, input_seqs: list[int]) -> bytes:
    body = _INTENT_HEAD.pack(_INTENT_MAGIC, 1, out_seq, len(input_seqs)) + struct.pack(
        f"<{len(input_seqs)}Q", *input_seqs
    )
    return body + struct.pack("<I", crc32c.crc32c(body))


def decode_intent(data: bytes) -> tuple[int, list[int]] | None:
    if len(data) < _INTENT_HEAD.size + 4:
        return None
    magic, version, out_seq, n = _INTENT_HEAD.unpack_from(data)
    end = _INTENT_HEAD.size + 8 * n
    if magic != _INTENT_MAGIC or version != 1 or len(data) != end + 4:
        return None
    if crc32c.crc32c(data[:end]) != struct.unpack_from("<I", data, end)[0]:
        return None
    return out_seq, list(struct.unpack_from(f"<{n}Q", data, _INTENT_HEAD.size))


def recover_intents(disk: Disk, uid: str) -> list[str]:
    """Finish or undo every phase-3 rewrite a crash interrupted (before the segments of
    ``uid`` are loaded); returns what it did, for the log."""
    directory = segment_dir(uid)
    done: list[str] = []
    for name in disk.listdir(directory):
        if not name.endswith(INTENT_SUFFIX):
            continue
        path = f"{directory}/{name}"
        decoded = decode_intent(disk.read(path))
        # An intent is written atomically: a damaged one was never acted upon.
        if decoded is not None:
            out_seq, input_seqs = decoded
            out = segment_path(uid, out_seq)
            if _complete(disk, out):
                for seq in input_seqs:
                    if disk.exists(segment_path(uid, seq)):
                        disk.remove(segment_path(uid, seq))
                done.append(f"rolled {path} forward")
            else:
                for leftover in (out, out + ".tmp"):
                    if disk.exists(leftover):
                        disk.remove(leftover)
                done.append(f"rolled {path} back")
            disk.sync_dir(directory)
        disk.remove(path)
        disk.sync_dir(directory)
    return done


def _complete(disk: Disk, path: str) -> bool:
    if not disk.exists(path):
        return False
    info = read_segment_info(disk, path)
    if info is None:
        return False
    try:
        SegmentReader(disk, info).close()
    except StorageFailed:
        return False
    return True


def new_job(
    disk: Disk,
    limits: Limits,
    log: ServerLog,
    generation: int,
    before: list[SegmentStat],
    plan: tuple[list[SegmentStat], list[SegmentStat], list[list[SegmentStat]]],
    *,
    promoted: bool,
    started: float,
) -> CompactionJob:
    deletes, cuts, groups = plan
    jobs_groups = []
    for group in groups:
        jobs_groups.append(_Group(log.next_segment_seq, group))
        log.next_segment_seq += 1
    return CompactionJob(
        disk,
        limits,
        log.uid,
        generation,
        log.snapshot_index(),
        log.snapshot_live,
        before,
        deletes,
        [_Cut(c) for c in cuts],
        jobs_groups,
        started,
        promoted,
    )


__all__ = [
    "INTENT_SUFFIX",
    "CompactionJob",
    "CompactionResult",
    "Phase",
    "SegmentStat",
    "cut_dead_tail",
    "decode_intent",
    "encode_intent",
    "intent_path",
    "log_stats",
    "new_job",
    "plan_phases",
    "recover_intents",
    "segment_stat",
    "within_ratio",
]
