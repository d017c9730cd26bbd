from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EntryDamaged, StorageFailed
from engine.raft.entry import Entry, EntryKind
from engine.storage.disk import FakeDisk, write_file_atomic
from engine.storage.segment import (
    HEAD_READ_BYTES,
    HEADER_BYTES,
    OVERWRITES,
    SLOT_BYTES,
    ReaderCache,
    SegmentReader,
    encode_header,
    encode_segment,
    encode_segment_rows,
    read_segment_info,
    segment_path,
    write_segment,
)
from tests.engine.storage.conftest import entries


def test_segment_round_trip_reads_any_entry_without_a_scan() -> None:
    disk = FakeDisk()
    written = entries(5, 20, term=3)
    write_segment(disk, "q", 7, written, OVERWRITES)
    info = read_segment_info(disk, segment_path("q", 7))
    assert info is not None
    assert (info.seq, info.lo, info.hi, info.count, info.flags) == (7, 5, 24, 20, OVERWRITES)
    reader = SegmentReader(disk, info)
    assert [reader.read(i) for i in range(5, 25)] == written
    assert reader.read(4) is None and reader.read(25) is None and reader.term(9) == 3


def test_sparse_segment_answers_only_for_its_entries() -> None:
    disk = FakeDisk()
    kept = [e for e in entries(1, 30) if e.index % 3 == 0]
    write_segment(disk, "q", 1, kept, 0)
    info = read_segment_info(disk, segment_path("q", 1))
    assert info is not None
    reader = SegmentReader(disk, info)
    assert [reader.read(i) for i in (3, 15, 30)] == [kept[0], kept[4], kept[9]]
    assert reader.read(4) is None and reader.term(29) is None


def test_a_small_segments_last_row_is_read_with_its_header() -> None:
    disk = FakeDisk()
    write_segment(disk, "q", 1, entries(1, 20, term=3), 0)
    kept = [e for e in entries(1, 31, term=5) if e.index % 3 == 0]
    write_segment(disk, "q", 2, kept, 0)
    rows = HEAD_READ_BYTES // 48
    write_segment(disk, "q", 3, entries(1, rows, term=2), 0)
    tails = []
    for seq in (1, 2, 3):
        info = read_segment_info(disk, segment_path("q", seq))
        assert info is not None
        tails.append((info.tail_index, info.tail_term))
    assert tails == [(20, 3), (30, 5), (0, 0)]  # the third's index ends past the read
    disk.flip_bit(segment_path("q", 1), (HEADER_BYTES + 10) * 8)  # its index damaged
    info = read_segment_info(disk, segment_path("q", 1))
    assert info is not None and (info.hi, info.tail_index, info.tail_term) == (20, 0, 0)


def test_damaged_header_index_or_data_is_detected() -> None:
    disk = FakeDisk()
    write_segment(disk, "q", 1, entries(1, 4), OVERWRITES)
    path = segment_path("q", 1)
    size = len(disk.read(path))
    disk.flip_bit(path, (size - 3) * 8)  # in the data of the last entry
    info = read_segment_info(disk, path)
    assert info is not None
    reader = SegmentReader(disk, info)
    assert reader.read(1) == entries(1, 1)[0]
    with pytest.raises(StorageFailed, match="entry 4 fails its CRC32C"):
        reader.read(4)
    disk.flip_bit(path, (HEADER_BYTES + 10) * 8)  # in the index section
    with pytest.raises(StorageFailed, match="index section"):
        SegmentReader(disk, info)
    disk.flip_bit(path, 40 * 8)  # in the header
    assert read_segment_info(disk, path) is None


def test_reader_cache_keeps_a_bounded_number_open() -> None:
    disk = FakeDisk()
    infos = []
    for seq in range(1, 5):
        write_segment(disk, "q", seq, entries(seq * 10, 2), OVERWRITES)
        info = read_segment_info(disk, segment_path("q", seq))
        assert info is not None
        infos.append(info)
    cache = ReaderCache(disk, open_max=2)
    for info in infos:
        assert cache.get(info).read(info.lo) is not None
    assert cache.open_count() == 2
    assert cache.get(infos[-1]) is cache.get(infos[-1])


def test_the_second_header_slot_lets_dead_data_be_cut_off_the_end() -> None:
    """What compaction phase 2 will do: new header in the other slot, sync, truncate."""
    disk = FakeDisk()
    written = entries(1, 6)
    write_segment(disk, "q", 1, written, OVERWRITES)
    path = segment_path("q", 1)
    info = read_segment_info(disk, path)
    assert info is not None and info.generation == 1
    reader = SegmentReader(disk, info)
    keep = 4
    index_bytes = reader.index[:keep].tobytes()
    end = int(reader.index["offset"][keep - 1] + reader.index["length"][keep - 1])
    slot = encode_header(1, OVERWRITES, keep, 1, 4, info.data_offset, index_bytes, 2)
    f = disk.open(path)
    f.pwrite(SLOT_BYTES, slot)
    f.sync()
    f.truncate(end)
    f.sync()
    cut = read_segment_info(disk, path)
    assert cut is not None and (cut.generation, cut.count, cut.hi) == (2, 4, 4)
    assert (cut.tail_index, cut.tail_term) == (4, 1)
    assert [SegmentReader(disk, cut).read(i) for i in range(1, 5)] == written[:4]
    disk.flip_bit(path, 8 * (SLOT_BYTES + 8))  # the new slot damaged: the old one rules
    assert read_segment_info(disk, path) == dataclasses.replace(info, bytes=end)


@given(
    st.integers(1, 40),
    st.sets(st.integers(0, 39)),
    st.integers(1, 400),
    st.data(),
)
@settings(max_examples=60, deadline=None)
def test_check_run_agrees_with_reading_the_entries(
    count: int, dropped: set[int], max_bytes: int, data: st.DataObject
) -> None:
    """``check_run`` checks what ``read_run`` would return (same run, same stop at a
    hole or at ``max_bytes``) without building entries, and stops at the same damage."""
    disk = FakeDisk()
    kept = [e for k, e in enumerate(entries(10, count, size=24)) if k == 0 or k not in dropped]
    write_segment(disk, "q", 1, kept, 0)
    path = segment_path("q", 1)
    info = read_segment_info(disk, path)
    assert info is not None
    lo = data.draw(st.sampled_from([e.index for e in kept]), label="lo")
    hi = data.draw(st.integers(lo + 1, 10 + count + 1), label="hi")
    run = SegmentReader(disk, info).read_run(lo, hi, max_bytes)
    assert SegmentReader(disk, info).check_run(lo, hi, max_bytes) == lo + len(run)
    victim = data.draw(st.sampled_from(kept), label="victim")
    size = len(disk.read(path))
    body_at = size - sum(len(e.data) for e in kept if e.index >= victim.index)
    disk.flip_bit(path, (body_at + 3) * 8)
    reader = SegmentReader(disk, info)
    try:
        reader.read_run(lo, hi, max_bytes)
    except EntryDamaged as e:
        with pytest.raises(EntryDamaged) as checked:
            reader.check_run(lo, hi, max_bytes)
        assert checked.value.index == e.index == victim.index
    else:
        assert reader.check_run(lo, hi, max_bytes) == lo + len(run)


@given(
    st.integers(1, 90),
    st.sets(st.integers(1, 89)),
    st.lists(st.integers(0, 60), min_size=90, max_size=90),
    st.data(),
)
@settings(max_examples=150, deadline=None)
def test_read_block_reads_the_held_run_its_bounds_allow(
    count: int, dropped: set[int], sizes: list[int], data: st.DataObject
) -> None:
    """``read_block`` against a model over runs of a few rows and of many (the reader
    finds the bounds of a short run another way than those of a long one): the entries
    from ``lo`` up to the first hole, of those the ones below ``want_hi`` within
    ``want_bytes_max`` (at least one), or, if more, the ones within ``block_bytes``."""
    disk = FakeDisk()
    made = [
        dataclasses.replace(e, data=bytes([k % 251]) * sizes[k])
        for k, e in enumerate(entries(10, count))
    ]
    kept = [e for k, e in enumerate(made) if k == 0 or k not in dropped]
    write_segment(disk, "q", 1, kept, 0)
    info = read_segment_info(disk, segment_path("q", 1))
    assert info is not None
    lo = data.draw(st.sampled_from([e.index for e in kept]), label="lo")
    hi = data.draw(st.integers(lo + 1, 10 + count + 1), label="hi")
    want_hi = data.draw(st.integers(lo + 1, hi), label="want_hi")
    want_bytes_max = data.draw(st.integers(0, 800), label="want_bytes_max")
    block_bytes = data.draw(st.sampled_from([0, 1, 60, 500, 5000]), label="block_bytes")
    by_index = {e.index: e for e in kept}
    held: list[Entry] = []
    while lo + len(held) < hi and lo + len(held) in by_index:
        held.append(by_index[lo + len(held)])

    def within(limit: int, below: int) -> int:
        n = total = 0
        for e in held[: below - lo]:
            total += len(e.data)
            if total > limit:
                break
            n += 1
        return n

    wanted = within(want_bytes_max, want_hi)
    ahead = within(block_bytes, hi) if block_bytes else 0
    expected = held[: max(1, wanted, ahead)]
    got = SegmentReader(disk, info).read_block(lo, want_hi, hi, want_bytes_max, block_bytes)
    assert got == expected


_ENTRY_ROWS = st.lists(
    st.tuples(
        st.integers(1, 3),  # gap before the entry (1: dense)
        st.integers(1, 2**40),
        st.sampled_from(list(EntryKind)),
        st.integers(0, 2**45),
        st.binary(max_size=64),
    ),
    min_size=1,
    max_size=30,
)


@given(rows=_ENTRY_ROWS, first=st.integers(1, 1000), lo_back=st.integers(0, 3))
def test_a_segment_encoded_from_mem_rows_is_the_one_encoded_from_entries(
    rows: list[tuple[int, int, EntryKind, int, bytes]], first: int, lo_back: int
) -> None:
    """What the segment flush writes from the mem table's rows reads back as the entries."""
    index = first
    written: list[Entry] = []
    for k, (gap, term, kind, now_ms, data) in enumerate(rows):
        index += gap if k else 0
        written.append(Entry(index, term, kind, now_ms, data))
    lo = max(1, first - lo_back)
    dense = written[-1].index - first + 1 == len(written)
    indexes = range(first, written[-1].index + 1) if dense else [e.index for e in written]
    mem_rows = [(e.term, int(e.kind), e.now_ms, e.data) for e in written]
    parts = encode_segment_rows(3, indexes, mem_rows, OVERWRITES, lo)
    assert b"".join(parts) == encode_segment(3, written, OVERWRITES, lo)
    disk = FakeDisk()
    disk.makedirs("queues/q/segments")
    write_file_atomic(disk, segment_path("q", 3), parts[0], parts[1:])
    info = read_segment_info(disk, segment_path("q", 3))
    assert info is not None and (info.lo, info.hi, info.count) == (lo, index, len(written))
    reader = SegmentReader(disk, info)
    assert [reader.read(e.index) for e in written] == written
