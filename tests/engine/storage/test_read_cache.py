"""The node's read cache of segment blocks against plain reads: whatever the reads, the
segments (dense or sparse, some entries still in the mem table) and the changes to the
files (a segment replaced at the same path, a log removed and made again), a log reading
through the cache (and through the node's kept read buffer, ``ReadScratch``) returns
exactly what a log without one returns, entries read earlier stay as they were while
later reads reuse that buffer, and the cache never holds more bytes than its budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import FakeDisk
from engine.storage.read_cache import ENTRY_OVERHEAD_BYTES, ReadCache, block_of
from engine.storage.segment import (
    OVERWRITES,
    ReaderCache,
    SegmentInfo,
    read_segment_info,
    segment_path,
    write_segment,
)
from engine.storage.server_log import ServerLog

UID = "q"
RUN_BYTES_MAX = 1 << 20


def _entries(lo: int, sizes: list[int], term: int) -> list[Entry]:
    return [
        Entry(lo + k, term, EntryKind.COMMAND, lo + k, f"{lo + k}:{term}:".encode().ljust(n, b"."))
        for k, n in enumerate(sizes)
    ]


def _segment(disk: FakeDisk, seq: int, written: list[Entry]) -> SegmentInfo:
    write_segment(disk, UID, seq, written, OVERWRITES)
    info = read_segment_info(disk, segment_path(UID, seq))
    assert info is not None
    return info


def _logs(
    disk: FakeDisk, cache: ReaderCache, layout: list[list[Entry]], mem: list[Entry]
) -> tuple[ServerLog, ServerLog]:
    """A log reading through ``cache`` and one reading without a read cache, over the
    same segments (one per item of ``layout``, sparse where entries were left out) and
    the same mem table."""
    cached = ServerLog(UID, disk, cache)
    plain = ServerLog(UID, disk, ReaderCache(disk, 4))
    for seq, written in enumerate(layout, 1):
        info = _segment(disk, seq, written)
        for log in (cached, plain):
            log.add_segment(info)
    for log in (cached, plain):
        log.last_from_segments()
        if mem:
            log.apply_append(tuple(mem), 1)
    return cached, plain


@st.composite
def _layouts(draw: st.DrawFn, term: int) -> tuple[list[list[Entry]], list[Entry]]:
    """Segments of entries of random sizes, some with holes (dead entries left out), and
    a mem table after them."""
    layout: list[list[Entry]] = []
    lo = 1
    for _ in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=12))
        written = _entries(lo, sizes, term)
        inner = st.integers(1, len(written) - 2)  # a segment's first and last are held
        holes = draw(st.sets(inner, max_size=3)) if len(written) > 2 else set()
        layout.append([e for k, e in enumerate(written) if k not in holes])
        lo += len(sizes)
    mem_sizes = draw(st.lists(st.integers(0, 300), max_size=5))
    return layout, _entries(lo, mem_sizes, term)


def _readable(layout: list[list[Entry]], mem: list[Entry]) -> list[int]:
    return [e.index for written in layout for e in written] + [e.index for e in mem]


@st.composite
def _reads(draw: st.DrawFn, readable: list[int]) -> list[list[int]]:
    """Sequences of ascending distinct indexes, each one a receive's worth."""
    picks = st.lists(st.sampled_from(readable), min_size=1, max_size=20, unique=True)
    return [sorted(p) for p in draw(st.lists(picks, min_size=1, max_size=12))]


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    bytes_max=st.integers(0, 3000),
    block_bytes=st.integers(1, 1200),
    scratch_bytes_max=st.integers(0, 2000),
)
def test_reads_through_the_cache_equal_plain_reads_and_stay_in_budget(
    data: st.DataObject, bytes_max: int, block_bytes: int, scratch_bytes_max: int
) -> None:
    disk = FakeDisk()
    blocks = ReadCache(bytes_max, block_bytes)
    cache = ReaderCache(disk, 2, blocks, scratch_bytes_max)
    layout, mem = data.draw(_layouts(term=1))
    cached, plain = _logs(disk, cache, layout, mem)
    readable = _readable(layout, mem)
    kept: list[tuple[list[Entry], list[Entry]]] = []
    for indexes in data.draw(_reads(readable)):
        got, expected = cached.read_many(indexes, RUN_BYTES_MAX), plain.read_many(indexes, 1)
        assert got == expected
        kept.append((got, [Entry(e.index, e.term, e.kind, e.now_ms, bytes(e.data)) for e in got]))
        assert blocks.bytes <= bytes_max
        assert blocks.bytes == sum(b.bytes for b in _all_blocks(blocks))
    # what was read stays as it was read, whatever the reads after it
    assert all(got == copied and all(type(e.data) is bytes for e in got) for got, copied in kept)
    assert cached.reads == plain.reads
    assert cached.reads_in_memory == plain.reads_in_memory
    # Another incarnation of the log (removed, then made again) writes other entries at
    # the same paths: nothing read from the old files is served.
    disk2_layout, mem2 = data.draw(_layouts(term=2))
    for seq in range(1, len(layout) + 1):
        disk.remove(segment_path(UID, seq))
    again, plain2 = _logs(disk, cache, disk2_layout, mem2)
    for indexes in data.draw(_reads(_readable(disk2_layout, mem2))):
        got = again.read_many(indexes, RUN_BYTES_MAX)
        assert got == plain2.read_many(indexes, 1)
        assert all(e.term == 2 for e in got)
        assert blocks.bytes <= bytes_max


def _all_blocks(blocks: ReadCache) -> list[object]:
    return list(blocks._lru.values())


def test_a_consumer_reading_front_to_back_reads_each_block_once() -> None:
    """Receives of 100 messages from entries of 1,000 (a publish batch each): the entries
    a receive reads are found in the cache by the next ones, one ``pread`` per block."""
    disk = FakeDisk()
    blocks = ReadCache(1 << 20, 64 * 1024)
    cache = ReaderCache(disk, 4, blocks)
    log = ServerLog(UID, disk, cache)
    log.add_segment(_segment(disk, 1, _entries(1, [20_000] * 30, 1)))
    log.last_from_segments()
    for receive in range(30 * 10):  # ten receives per entry
        entry = 1 + receive // 10
        assert [e.index for e in log.read_many([entry], RUN_BYTES_MAX)] == [entry]
    assert log.segment_reads == 10  # three entries of 20 KB per 64 KiB block
    assert log.cache_hits == 300 - 10
    assert blocks.stats().misses == 10 and blocks.stats().hits == 290


def test_blocks_are_evicted_least_recently_used_first_and_dropped_with_their_file() -> None:
    disk = FakeDisk()
    info = _segment(disk, 1, _entries(1, [100] * 6, 1))
    size = 100 + ENTRY_OVERHEAD_BYTES
    blocks = ReadCache(3 * size, 1)
    written = _entries(1, [100] * 6, 1)
    for k in range(3):
        assert blocks.put(block_of(info, written[k : k + 1]))
    assert blocks.find(info, 1) is not None  # 1 is now the most recently used
    assert blocks.put(block_of(info, written[3:4]))
    assert blocks.find(info, 2) is None and blocks.find(info, 1) is not None
    assert blocks.stats().evictions == 1 and blocks.bytes == 3 * size
    other = _segment(disk, 2, _entries(7, [100] * 4, 1))
    assert not blocks.put(block_of(other, _entries(7, [100] * 4, 1)))  # over the budget
    assert blocks.next_lo(info, 1) == 3
    cache = ReaderCache(disk, 2, blocks)
    cache.evict(info.path)
    assert len(blocks) == 0 and blocks.bytes == 0


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    bytes_max=st.integers(0, 3000),
    block_bytes=st.integers(1, 1200),
)
def test_the_recovery_check_keeps_small_runs_and_reads_after_it_equal_plain_reads(
    data: st.DataObject, bytes_max: int, block_bytes: int
) -> None:
    """``first_damaged`` (recovery's check of the log after the checkpoint) keeps a run
    that fits in a block; the replay's ``entries``, ``term`` and deliveries then read
    exactly what a log without a read cache reads, within the budget."""
    disk = FakeDisk()
    blocks = ReadCache(bytes_max, block_bytes)
    cache = ReaderCache(disk, 2, blocks)
    layout, mem = data.draw(_layouts(term=1))
    cached, plain = _logs(disk, cache, layout, mem)
    lo = data.draw(st.integers(1, max(1, cached.last_index())))
    assert cached.first_damaged(lo, RUN_BYTES_MAX) == plain.first_damaged(lo, RUN_BYTES_MAX)
    assert blocks.bytes <= bytes_max and blocks.stats().hits == blocks.stats().misses == 0
    assert cached.first_damaged(lo, RUN_BYTES_MAX) == plain.first_damaged(lo, RUN_BYTES_MAX)
    readable = _readable(layout, mem)
    for index in readable:
        assert cached.term(index) == plain.term(index)
        end = cached.last_index() + 1
        assert _outcome(cached, index, end) == _outcome(plain, index, end)
    for indexes in data.draw(_reads(readable)):
        assert cached.read_many(indexes, RUN_BYTES_MAX) == plain.read_many(indexes, 1)
        assert blocks.bytes <= bytes_max


def _outcome(log: ServerLog, lo: int, hi: int) -> object:
    """``entries(lo, hi)``, or why it failed (a sparse log lacks its dead entries)."""
    try:
        return log.entries(lo, hi, RUN_BYTES_MAX)
    except LookupError as e:
        return str(e)


def test_after_the_recovery_check_a_small_tail_is_replayed_and_delivered_from_memory() -> None:
    """A queue's log after its checkpoint, small (an idle queue's few entries over two
    segments): once recovery checked it, neither the replay nor the first receive opens
    a segment again (a node of 10,000 queues had closed each reader long before)."""
    disk = FakeDisk()
    blocks = ReadCache(1 << 20, 64 * 1024)
    cache = ReaderCache(disk, 64, blocks)
    log = ServerLog(UID, disk, cache)
    log.add_segment(_segment(disk, 1, _entries(1, [300] * 4, 1)))
    log.add_segment(_segment(disk, 2, _entries(5, [100] * 3, 1)))
    log.last_from_segments()
    assert log.first_damaged(2, RUN_BYTES_MAX) == (None, "")
    assert len(blocks) == 2
    cache.close()  # every reader closed, as on a node of thousands of queues
    assert [e.index for e in log.entries(2, 8, RUN_BYTES_MAX)] == [2, 3, 4, 5, 6, 7]
    assert log.term(7) == 1
    assert [e.index for e in log.read_many([3, 4, 5], RUN_BYTES_MAX)] == [3, 4, 5]
    assert cache.open_count() == 0 and log.segment_reads == 0
    assert log.cache_hits == 3
