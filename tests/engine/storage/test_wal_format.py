"""The WAL file format (version 2): an append is one run record that round-trips exactly,
is lost whole when torn, and is told apart from a torn tail when damaged before valid
data. Version 1 files are still read; a file of an unknown version refuses recovery."""

from __future__ import annotations

import random
import struct
import threading

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import RecoveryRefused
from engine.raft.entry import Entry, EntryKind
from engine.runtime.wal_writer import WalWriter
from engine.storage import FakeDisk, HardState, NodeStorage, Persisted, WalBatch
from engine.storage.wal import (
    AppendOp,
    ForgetOp,
    HardStateOp,
    ResetOp,
    Wal,
    WalOp,
    read_wal_file,
    wal_path,
)
from tests.engine.storage.conftest import entries, small_limits

U64_MAX = 2**64 - 1
UIDS = ("a", "b", "queue-with-a-longer-uid")


def merged(ops: list[WalOp]) -> list[WalOp]:
    """What the reader returns for ``ops``: consecutive appends of one server with
    contiguous indexes come back as one append."""
    out: list[WalOp] = []
    for op in ops:
        last = out[-1] if out else None
        if (
            isinstance(op, AppendOp)
            and isinstance(last, AppendOp)
            and last.uid == op.uid
            and last.entries[-1].index + 1 == op.entries[0].index
        ):
            out[-1] = AppendOp(op.uid, last.entries + op.entries)
        else:
            out.append(op)
    return out


def write_all(wal: Wal) -> list[WalBatch]:
    batches = []
    while wal.pending():
        batch = wal.write_batch()
        assert batch.error is None
        batches.append(batch)
    return batches


def record_offsets(disk: FakeDisk, seq: int) -> list[int]:
    """Offset of every record of a WAL file, read with the format's own framing."""
    data = disk.read(wal_path(seq))
    pos, out = 20, []
    while pos < len(data):
        out.append(pos)
        pos += 8 + struct.unpack_from("<I", data, pos)[0]
    assert pos == len(data)
    return out


def rewrite(disk: FakeDisk, path: str, data: bytes) -> None:
    f = disk.open(path, create=True)
    f.truncate(0)
    f.append(data)
    f.sync()
    f.close()


# --- round trip -------------------------------------------------------------------------

fields = st.tuples(
    st.integers(1, U64_MAX),
    st.integers(0, U64_MAX),
    st.sampled_from(list(EntryKind)),
    st.binary(max_size=300),
)


@st.composite
def append_ops(draw: st.DrawFn) -> AppendOp:
    uid = draw(st.sampled_from(UIDS))
    rows = draw(st.lists(fields, min_size=1, max_size=40))
    first = draw(st.integers(1, U64_MAX - len(rows)))
    return AppendOp(
        uid,
        tuple(
            Entry(first + k, term, kind, now_ms, data)
            for k, (term, now_ms, kind, data) in enumerate(rows)
        ),
    )


other_ops = st.one_of(
    st.builds(
        HardStateOp,
        st.sampled_from(UIDS),
        st.builds(
            HardState,
            st.integers(0, U64_MAX),
            st.none() | st.sampled_from(UIDS),
            st.integers(0, U64_MAX),
        ),
    ),
    st.builds(ResetOp, st.sampled_from(UIDS), st.integers(1, U64_MAX), st.integers(1, U64_MAX)),
    st.builds(ForgetOp, st.sampled_from(UIDS)),
)


@st.composite
def contiguous_runs(draw: st.DrawFn) -> list[WalOp]:
    """Appends that continue each other, as a leader's are: the reader merges them."""
    uid = draw(st.sampled_from(UIDS))
    ops: list[WalOp] = []
    index = draw(st.integers(1, 1000))
    for rows in draw(st.lists(st.lists(fields, min_size=1, max_size=5), min_size=1, max_size=6)):
        ops.append(
            AppendOp(
                uid,
                tuple(Entry(index + k, t, kind, n, d) for k, (t, n, kind, d) in enumerate(rows)),
            )
        )
        index += len(rows)
    return ops


@settings(max_examples=150, deadline=None)
@given(
    groups=st.lists(
        st.one_of(
            append_ops().map(lambda op: [op]), other_ops.map(lambda op: [op]), contiguous_runs()
        ),
        min_size=1,
        max_size=12,
    ),
    batch_bytes=st.sampled_from([512, 4096, 1 << 20]),
)
def test_every_operation_round_trips_through_a_wal_file(
    groups: list[list[WalOp]], batch_bytes: int
) -> None:
    ops = [op for group in groups for op in group]
    disk = FakeDisk()
    limits = small_limits(wal_file_bytes_max=1 << 30, wal_batch_bytes_max=batch_bytes)
    wal = Wal(disk, limits, 1, {})
    for op in ops:
        wal.submit(op)
    batches = write_all(wal)
    assert [op for b in batches for op in b.ops] == ops
    read = read_wal_file(disk, 1)
    assert read.corrupt_at is None and read.good_bytes == read.size == len(disk.read(wal_path(1)))
    assert read.ops == merged(ops)


def test_one_append_is_one_record() -> None:
    disk = FakeDisk()
    wal = Wal(disk, small_limits(wal_file_bytes_max=1 << 20), 1, {})
    before = len(record_offsets(disk, 1))
    wal.submit(AppendOp("q", tuple(entries(1, 50))))
    write_all(wal)
    assert len(record_offsets(disk, 1)) == before + 3  # batch, register, run


def test_a_submitted_append_must_be_contiguous_and_within_the_entry_limit() -> None:
    wal = Wal(FakeDisk(), small_limits(entry_bytes_max=256), 1, {})
    gap = entries(1, 2) + entries(4, 1)
    with pytest.raises(AssertionError, match="contiguous"):
        wal.submit(AppendOp("q", tuple(gap)))
    with pytest.raises(AssertionError, match="entry_bytes_max"):
        wal.submit(AppendOp("q", tuple(entries(1, 3, size=257))))
    with pytest.raises(AssertionError, match="empty"):
        wal.submit(AppendOp("q", ()))
    assert not wal.pending()


# --- torn and damaged run records -------------------------------------------------------


def three_batches(disk: FakeDisk) -> tuple[list[int], list[WalOp]]:
    """A WAL file of three batches, each with a run record of ``q``; returns the file
    size after each batch and the ops."""
    wal = Wal(disk, small_limits(wal_file_bytes_max=1 << 20, wal_batch_bytes_max=1 << 16), 1, {})
    ops: list[WalOp] = [
        AppendOp("q", tuple(entries(1, 3, size=20))),
        AppendOp("q", tuple(entries(4, 4, size=30))),
        AppendOp("q", tuple(entries(8, 2, size=10))),
    ]
    ends = []
    for op in ops:
        wal.submit(op)
        write_all(wal)
        ends.append(len(disk.read(wal_path(1))))
    return ends, ops


def test_a_torn_run_record_loses_its_whole_append_and_nothing_before_it() -> None:
    disk = FakeDisk()
    ends, ops = three_batches(disk)
    data = disk.read(wal_path(1))
    last_run = record_offsets(disk, 1)[-1]
    for cut in range(ends[1], len(data)):
        rewrite(disk, wal_path(1), data[:cut])
        read = read_wal_file(disk, 1)
        assert read.corrupt_at is None, cut  # a torn tail, not corruption
        assert read.ops == merged(ops[:2]), cut
        assert read.good_bytes == (last_run if cut >= last_run else ends[1])  # whole records
    rewrite(disk, wal_path(1), data[: ends[2] - 1])
    disk.crash()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    log = storage.open_server("q").log
    assert log.entries(1, 100, 1 << 20) == entries(1, 3, size=20) + entries(4, 4, size=30)


def test_a_bit_flip_in_a_run_record_before_valid_data_is_corruption() -> None:
    disk = FakeDisk()
    ends, _ = three_batches(disk)
    offsets = record_offsets(disk, 1)
    middle_run = max(o for o in offsets if o < ends[1])
    for bit in range(8 * middle_run, 8 * ends[1]):
        disk.flip_bit(wal_path(1), bit)
        read = read_wal_file(disk, 1)
        assert (read.corrupt_at, read.valid_at) == (middle_run, ends[1]), bit
        assert [op.entries[-1].index for op in read.ops if isinstance(op, AppendOp)] == [3]
        disk.flip_bit(wal_path(1), bit)
    disk.flip_bit(wal_path(1), 8 * middle_run + 8 * 30)
    disk.crash()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    with pytest.raises(RecoveryRefused, match="no other member to repair it from"):
        storage.open_server("q", repairable=False)  # a lone member cannot be repaired
    rec = storage.open_server("q")  # a replicated one is repaired from its peers
    assert rec.repairing and f"corrupt at byte {middle_run}" in (rec.repair_reason or "")
    assert rec.log.last_index() <= 3  # nothing from the damaged append on is trusted


def test_a_bit_flip_in_the_last_run_record_reads_as_a_torn_tail() -> None:
    rng = random.Random(7)
    disk = FakeDisk()
    ends, ops = three_batches(disk)
    last_run = record_offsets(disk, 1)[-1]
    for bit in rng.sample(range(8 * last_run, 8 * ends[2]), 64):
        disk.flip_bit(wal_path(1), bit)
        read = read_wal_file(disk, 1)
        assert read.corrupt_at is None and read.good_bytes == last_run
        assert read.ops == merged(ops[:2])
        disk.flip_bit(wal_path(1), bit)


# --- versions ---------------------------------------------------------------------------


def version_1_file(seq: int, uid: str, stored: list[Entry], hard_state: HardState) -> bytes:
    """A WAL file as version 1 wrote it, spelled out from the documented layout."""

    def record(body: bytes) -> bytes:
        return struct.pack("<II", len(body), crc32c.crc32c(body)) + body

    head = struct.pack("<4sIQ", b"QWAL", 1, seq)
    out = [head, struct.pack("<I", crc32c.crc32c(head))]
    out.append(record(struct.pack("<B8sQ", 0, b"\xa7QBATCH\x5c", seq)))
    out.append(record(struct.pack("<BI", 1, 1) + uid.encode()))
    out.append(record(struct.pack("<BIQQB", 3, 1, hard_state.term, hard_state.commit, 0)))
    for e in stored:
        head = struct.pack("<BIQQQB", 2, 1, e.index, e.term, e.now_ms, int(e.kind))
        out.append(record(head + e.data))
    return b"".join(out)


def test_a_version_1_wal_is_replayed_and_new_writes_use_version_2() -> None:
    disk = FakeDisk()
    old = [*entries(1, 5, size=30), Entry(6, 2, EntryKind.NOOP, 60, b"")]
    disk.makedirs("wal")
    rewrite(disk, wal_path(1), version_1_file(1, "q", old, HardState(2, None, 4)))
    disk.sync_dir("wal")
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    rec = storage.open_server("q")
    assert rec.hard_state == HardState(2, None, 4)
    assert rec.log.entries(1, 10, 1 << 20) == old
    storage.append("q", entries(7, 2, term=2))
    assert storage.sync() == [Persisted("q", 8, 2)]
    assert struct.unpack_from("<I", disk.read(wal_path(storage.wal.seq)), 4)[0] == 2
    disk.crash()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    assert storage.open_server("q").log.entries(1, 10, 1 << 20) == old + entries(7, 2, term=2)


def test_a_wal_file_of_an_unknown_version_refuses_recovery() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    storage.open_server("q")
    storage.append("q", entries(1, 2))
    storage.sync()
    data = bytearray(disk.read(wal_path(1)))
    struct.pack_into("<I", data, 4, 99)
    struct.pack_into("<I", data, 16, crc32c.crc32c(bytes(data[:16])))
    rewrite(disk, wal_path(1), bytes(data))
    disk.crash()
    with pytest.raises(RecoveryRefused, match="format version 99"):
        NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    assert disk.read(wal_path(1)) == bytes(data)  # left as it was, not cut as torn


# --- group commit -----------------------------------------------------------------------


def test_an_append_alone_is_one_batch_and_one_sync() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    storage.open_server("q")
    batches: list[WalBatch] = []
    arrived = threading.Semaphore(0)

    def on_batch(batch: WalBatch) -> None:
        batches.append(batch)
        arrived.release()

    thread = WalWriter(storage.wal, on_batch)
    thread.start()
    for i in range(1, 6):
        syncs = disk.syncs
        storage.append("q", entries(i, 1))
        assert arrived.acquire(timeout=10)
        assert disk.syncs == syncs + 1 and len(batches[-1].ops) == 1
        assert storage.complete(batches[-1]) == [Persisted("q", i, 1)]
    thread.stop()


def test_an_append_above_the_batch_limit_is_written_alone() -> None:
    storage = NodeStorage.open(
        FakeDisk(), small_limits(wal_batch_bytes_max=512, wal_file_bytes_max=1 << 20)
    )
    storage.open_server("q")
    storage.append("q", entries(1, 1, size=10))
    storage.append("q", entries(2, 4, size=200))  # 800 bytes of payload
    storage.append("q", entries(6, 1, size=10))
    sizes = []
    while storage.wal.pending():
        batch = storage.write_batch()
        sizes.append([len(op.entries) for op in batch.ops if isinstance(op, AppendOp)])
    assert sizes == [[1], [4], [1]]


def test_the_writer_thread_misses_no_submit() -> None:
    """Submits race the writer taking the pending list (it is woken only by a submit that
    finds nothing pending): every one is written without waiting for ``stop``."""
    rng = random.Random(3)
    storage = NodeStorage.open(FakeDisk(), small_limits(wal_file_bytes_max=1 << 20))
    uids = [f"q{k}" for k in range(8)]
    for uid in uids:
        storage.open_server(uid)
    submits = 400
    batches: list[WalBatch] = []
    all_written = threading.Event()

    def on_batch(batch: WalBatch) -> None:
        batches.append(batch)
        if sum(len(b.ops) for b in batches) == submits:
            all_written.set()

    thread = WalWriter(storage.wal, on_batch)
    thread.start()
    last = dict.fromkeys(uids, 0)
    for _ in range(submits):
        uid = rng.choice(uids)
        n = rng.randint(1, 3)
        storage.append(uid, entries(last[uid] + 1, n))
        last[uid] += n
        if rng.random() < 0.2:
            threading.Event().wait(rng.random() / 2000)
    assert all_written.wait(10)
    thread.stop()
    persisted: dict[str, int] = {}
    for batch in list(batches):
        for event in storage.complete(batch):
            assert isinstance(event, Persisted)
            persisted[event.uid] = event.index
    assert persisted == {uid: n for uid, n in last.items() if n}
