"""A sleeping queue's log packed into one ``bytes`` and back (``ServerLog.pack``,
``ServerLogs.pack``): the log unpacked answers every question as the one packed did."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import FakeDisk
from engine.storage.segment import COMPACTED, OVERWRITES, ReaderCache, SegmentInfo, segment_path
from engine.storage.server_log import ServerLog
from engine.storage.server_logs import PACKED_ROWS_BYTES_MAX, ServerLogs
from engine.storage.wal import AppendOp, HardState

UID = "q-uid"


def _observed(log: ServerLog) -> tuple[object, ...]:
    """Everything a reader of a log (its Raft core, recovery, stats) can see of it."""
    return (
        log.first_index(),
        log.last_index(),
        log.snapshot_index(),
        log.snapshot_term(),
        list(log.snapshot_live),
        log.segment_infos(),
        log.hard_state,
        log.next_segment_seq,
        (log.reads, log.reads_in_memory, log.cache_hits, log.segment_reads, log.segment_bytes),
        [log.segments_after(i) for i in range(0, log.last_index() + 2)],
        [log.is_dead(i) for i in range(0, log.last_index() + 2)],
        (len(log.mem), log.mem.lo, log.mem.bytes, log.mem.first_wal_seq),
        log.mem.flushable(2**40),
    )


@st.composite
def logs(draw: st.DrawFn) -> ServerLog:
    disk = FakeDisk()
    log = ServerLog(UID, disk, ReaderCache(disk, 4))
    lo = 1
    for seq in range(1, draw(st.integers(0, 6)) + 1):
        n = draw(st.integers(1, 50))
        flags = draw(st.sampled_from([0, OVERWRITES, COMPACTED]))
        start = lo if flags != OVERWRITES else max(1, lo - draw(st.integers(0, 5)))
        # Compaction's outputs may have a path of their own: it is kept as it is.
        path = draw(st.sampled_from([segment_path(UID, seq), f"queues/{UID}/c/{seq}.seg"]))
        offsets = draw(st.tuples(*[st.integers(0, 2**32 - 1)] * 4))
        tail = draw(st.sampled_from([(0, 0), (start + n - 1, seq)]))  # read with the header
        info = SegmentInfo(path, seq, start, start + n - 1, n, flags, seq % 3, *offsets, *tail)
        log.add_segment(info)
        lo = start + n
    log.last_from_segments()
    if draw(st.booleans()):
        index = draw(st.integers(0, max(0, lo - 1)))
        live = BitMap64(draw(st.lists(st.integers(1, max(1, index)), max_size=20)))
        log.set_snapshot(index, draw(st.integers(0, 9)), live if index else BitMap64())
    if draw(st.booleans()):
        vote = draw(st.sampled_from([None, "n1/q-uid", "n2/q-uid"]))
        log.hard_state = HardState(draw(st.integers(0, 2**40)), vote, log.last_index())
    for wal_seq in range(1, draw(st.integers(1, 3))):  # rows waiting for their flush
        first = max(1, log.last_index() + 1 - draw(st.integers(0, 1)))  # may overwrite
        bodies = draw(st.lists(st.binary(max_size=20), min_size=1, max_size=3))
        kind = draw(st.sampled_from(list(EntryKind)))
        entries = tuple(Entry(first + k, 2, kind, 7 * k, b) for k, b in enumerate(bodies))
        log.apply_append(entries, wal_seq)
    log.reads, log.reads_in_memory = draw(st.integers(0, 10**9)), draw(st.integers(0, 99))
    log.cache_hits, log.segment_reads = draw(st.integers(0, 99)), draw(st.integers(0, 99))
    log.segment_bytes = draw(st.integers(0, 2**50))
    return log


@settings(max_examples=300, deadline=None)
@given(logs())
def test_a_packed_log_unpacks_to_the_same_log(log: ServerLog) -> None:
    packed = log.pack()
    disk = FakeDisk()
    again = ServerLog.unpacked(UID, disk, ReaderCache(disk, 4), packed)
    assert _observed(again) == _observed(log)
    assert again.pack() == packed
    assert ServerLog.packed_reads(packed) == (log.reads, log.reads_in_memory + log.cache_hits)


def test_a_packed_log_s_mem_table_rows_are_carried_and_flushed() -> None:
    """An idle log keeps its last entries in its mem table, carried from WAL file to
    WAL file: packed, they are still counted, carried, and flushed with their file."""
    disk = FakeDisk()
    logs = ServerLogs(disk, ReaderCache(disk, 4))
    entry = Entry(1, 1, EntryKind.COMMAND, 0, b"m")
    logs.apply(AppendOp(UID, (entry,)), 1)
    held = logs.mem_bytes()
    assert held > 0 and logs.pack(UID) and logs.is_packed(UID)
    assert logs.mem_bytes() == held and logs.items() == []
    logs.rows_to_flush(0)  # an older file's flush: not its rows
    assert logs.is_packed(UID)
    logs.carry(UID, 1)  # file 1 rolled, its rows carried into file 2
    assert logs.is_packed(UID) and logs.mem_bytes() == held
    logs.rows_to_flush(1)
    assert logs.is_packed(UID)
    logs.rows_to_flush(2)  # the flush of file 2 looks at unpacked logs only
    assert [log.mem.flushable(2) for _, log in logs.items()] == [[entry]]
    logs.existing(UID).drop_flushed(2)
    logs.repack()  # asked for from outside meanwhile: stays unpacked
    assert not logs.is_packed(UID) and logs.mem_bytes() == 0
    logs.pack(UID)
    logs.repack()
    assert logs.is_packed(UID)


def test_a_flush_packs_again_the_logs_it_unpacked() -> None:
    disk = FakeDisk()
    logs = ServerLogs(disk, ReaderCache(disk, 4))
    logs.apply(AppendOp(UID, (Entry(1, 1, EntryKind.COMMAND, 0, b"m"),)), 1)
    assert logs.pack(UID)
    logs.rows_to_flush(1)
    log = logs.find_for_flush(UID)
    assert log is not None and not logs.is_packed(UID)
    log.drop_flushed(1)
    logs.repack()
    assert logs.is_packed(UID) and logs.mem_bytes() == 0


def test_the_table_keeps_a_log_packed_until_asked_for_it_to_change_it() -> None:
    disk = FakeDisk()
    logs = ServerLogs(disk, ReaderCache(disk, 4))
    log = logs.get(UID)
    log.add_segment(SegmentInfo(segment_path(UID, 1), 1, 1, 10, 10, 0, 1, 0, 0, 0, 99))
    log.last_from_segments()
    log.reads, log.cache_hits = 7, 3
    before = _observed(log)
    assert logs.pack(UID)
    assert logs.items() == []  # a flush looks at none of it
    assert logs.uids() == [UID]
    assert _observed(logs.view(UID)) == before and logs.is_packed(UID)
    assert logs.reads(UID) == (7, 3) and logs.is_packed(UID)
    assert _observed(logs.existing(UID)) == before
    assert not logs.is_packed(UID)
    assert logs.existing(UID) is logs.get(UID)


def test_a_log_with_many_rows_is_packed_once_they_are_flushed() -> None:
    disk = FakeDisk()
    logs = ServerLogs(disk, ReaderCache(disk, 4))
    body = b"m" * (PACKED_ROWS_BYTES_MAX + 1)
    logs.apply(AppendOp(UID, (Entry(1, 1, EntryKind.COMMAND, 0, body),)), 1)
    assert not logs.pack(UID) and not logs.is_packed(UID)
    logs.rows_to_flush(1)
    log = logs.find_for_flush(UID)
    assert log is not None
    log.drop_flushed(1)
    logs.repack()
    assert logs.is_packed(UID)
    assert _observed(logs.view(UID)) == _observed(log)
