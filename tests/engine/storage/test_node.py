from __future__ import annotations

import dataclasses
import re
import threading
import time

import pytest
from pyroaring import BitMap64

from engine.raft.entry import EntryKind
from engine.runtime.wal_writer import WalWriter
from engine.storage import (
    Checkpoint,
    FakeDisk,
    HardState,
    NodeStorage,
    Persisted,
    Removed,
    SnapshotReset,
    WalBatch,
)
from engine.storage.disk import DiskFile
from engine.storage.segment import SegmentReader
from tests.engine.storage.conftest import entries, one_server, small_limits


def reopen(disk: FakeDisk, uid: str = "q", **change: int) -> NodeStorage:
    disk.crash()
    return NodeStorage.open(disk, small_limits(**change))


def all_entries(storage: NodeStorage, uid: str = "q") -> list[int]:
    log = storage.log(uid)
    return [
        (e.index, e.term) for e in log.entries(log.first_index(), log.last_index() + 1, 1 << 30)
    ]  # type: ignore[misc]


def test_overwrite_replaces_the_suffix_in_mem_table_and_segments() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 30, term=1, size=64))
    storage.sync()
    assert storage.rolled_wal_files() == [] and disk.listdir("queues/q/segments")
    storage.append("q", entries(12, 3, term=2))
    storage.sync()
    expected = [(i, 1) for i in range(1, 12)] + [(i, 2) for i in range(12, 15)]
    assert all_entries(storage) == expected
    assert storage.log("q").term(20) is None
    storage = reopen(disk)
    storage.open_server("q")
    assert all_entries(storage) == expected
    for i in range(6):  # roll more, so the overwrite itself reaches the segments
        storage.append("q", entries(15 + 5 * i, 5, term=2, size=64))
        storage.sync()
    storage = reopen(disk)
    storage.open_server("q")
    assert all_entries(storage) == expected + [(i, 2) for i in range(15, 45)]


class OpenCounting(FakeDisk):
    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        self.opened.append(path)
        return super().open(path, create=create)


def test_the_last_entrys_term_is_known_from_recovery_without_opening_its_segment() -> None:
    """A queue that comes back asleep checks its record against the log's last term at
    start: 10,000 of them opened 10,000 segment files again for it."""
    disk = OpenCounting()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 30, term=1, size=64))
    storage.append("q", entries(28, 3, term=2, size=64))
    storage.sync()
    storage.close()  # a clean stop: the mem table goes to segments
    log = NodeStorage.open(disk, small_limits(read_cache_bytes_max=0)).open_server("q").log
    assert [log.term(i) for i in (1, 5, 9, 13)] == [1, 1, 1, 1]  # other segments' readers
    disk.opened.clear()
    assert (log.last_index(), log.term(30)) == (30, 2) and disk.opened == []


def test_recovery_loads_the_checkpoint_and_keeps_the_log_after_it() -> None:
    disk = FakeDisk()
    storage = one_server(disk, entries(1, 40, size=40), HardState(1, "q", 35))
    cp = Checkpoint(30, 1, 1, b"cfg", BitMap64([3, 17]), b"state")
    storage.write_checkpoint("q", cp)
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.checkpoint == cp and rec.hard_state == HardState(1, "q", 35)
    assert rec.log.entries(31, 41, 1 << 20) == entries(31, 10, size=40)


def test_release_cursor_promotes_and_deletes_segments_without_live_entries() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 40, size=40))
    storage.sync()
    before = disk.listdir("queues/q/segments")
    storage.write_checkpoint("q", Checkpoint(30, 1, 1, b"", BitMap64([3]), b"s"))
    assert storage.release_cursor("q", 35) == 30
    log = storage.log("q")
    assert log.first_index() == 31 and log.snapshot_index() == 30 and log.term(30) == 1
    assert log.read(3) == entries(3, 1, size=40)[0]  # live, still readable
    with pytest.raises(LookupError):
        log.read(10)
    with pytest.raises(LookupError):
        log.entries(3, 10, 100)
    assert len(disk.listdir("queues/q/segments")) < len(before)
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.log.first_index() == 31 and rec.log.read(3).index == 3
    assert rec.log.entries(31, 41, 1 << 20) == entries(31, 10, size=40)


def test_installed_snapshot_replaces_the_log() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 40, term=1, size=40))
    storage.sync()
    storage.install_snapshot("q", Checkpoint(50, 3, 1, b"", BitMap64(), b"leader"))
    assert storage.sync() == [SnapshotReset("q", 50, 3)]
    storage.append("q", entries(51, 2, term=3))
    storage.sync()
    assert all_entries(storage) == [(51, 3), (52, 3)]
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.checkpoint is not None and rec.checkpoint.state == b"leader"
    assert (rec.log.first_index(), rec.log.last_index()) == (51, 52)


def test_a_damaged_segment_header_or_snapshot_resets_the_server_for_repair() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.open_server("r")
    storage.append("q", entries(1, 40, size=40))
    storage.append("r", entries(1, 2, size=40))
    storage.sync()
    storage.write_checkpoint("r", Checkpoint(2, 1, 1, b"", BitMap64(), b"s"))
    storage.release_cursor("r", 2)
    first = "queues/q/segments/" + disk.listdir("queues/q/segments")[0]
    disk.flip_bit(first, 8 * 20)
    disk.flip_bit("queues/r/snapshots/" + disk.listdir("queues/r/snapshots")[0], 8 * 58)
    storage = reopen(disk)
    q = storage.open_server("q")
    assert q.repairing and q.repair_reason and re.search(r"segment .* is damaged", q.repair_reason)
    assert q.log.last_index() == 0 and disk.listdir("queues/q/segments") == []
    r = storage.open_server("r")
    assert r.repairing and r.repair_reason and "snapshot at index 2 is damaged" in r.repair_reason
    assert r.checkpoint is None and r.log.last_index() == 0 and r.log.snapshot_index() == 0
    storage = reopen(disk)  # the WAL still holds the old entries: they stay gone
    for uid in ("q", "r"):
        rec = storage.open_server(uid)
        assert rec.repairing and rec.log.last_index() == 0 and rec.checkpoint is None


def test_lost_committed_entries_put_the_server_into_repair() -> None:
    disk = FakeDisk()
    one_server(disk, entries(1, 3), HardState(1, None, 3), small_limits(wal_file_bytes_max=1 << 20))
    reopen(disk, wal_file_bytes_max=1 << 20)  # the new WAL file carries the hard state
    disk.crash()
    f = disk.open("wal/00000001.wal")
    f.truncate(20)  # the entries are gone, as if the media lost them
    f.sync()
    rec = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20)).open_server("q")
    assert rec.repairing and rec.repair_reason and "commit index 3 is beyond" in rec.repair_reason
    assert rec.log.last_index() == 0


def test_corrupt_entry_in_a_segment_is_never_served() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 40, size=40))
    storage.sync()
    first = "queues/q/segments/" + disk.listdir("queues/q/segments")[0]
    disk.flip_bit(first, 8 * (len(disk.read(first)) - 2))
    storage = reopen(disk)
    rec = storage.open_server("q")
    # The log after the checkpoint (all of it here) is read at recovery: it is cut
    # before the damaged entry, the last of the first segment.
    assert rec.repairing and rec.repair_reason and "entry 4 fails its CRC32C" in rec.repair_reason
    assert rec.log.last_index() == 3
    assert [e.index for e in rec.log.entries(1, 10, 1 << 20)] == [1, 2, 3]


def test_wal_thread_runs_group_commits_in_a_thread() -> None:
    storage = NodeStorage.open(FakeDisk(), small_limits(wal_file_bytes_max=1 << 20))
    batches: list[WalBatch] = []
    done = threading.Event()

    def on_batch(batch: WalBatch) -> None:
        batches.append(batch)
        if sum(len(b.ops) for b in batches) == 20:
            done.set()

    thread = WalWriter(storage.wal, on_batch)
    thread.start()
    for k in range(20):
        storage.open_server(f"q{k}")
        storage.append(f"q{k}", entries(1, 1))  # wakes the writer thread
    assert done.wait(10)
    thread.stop()
    events = [e for b in batches for e in storage.complete(b)]
    assert sorted(events, key=lambda e: e.uid) == sorted(
        (Persisted(f"q{k}", 1, 1) for k in range(20)), key=lambda e: e.uid
    )


def test_a_removed_server_leaves_no_files_even_if_a_crash_interrupts_it() -> None:
    for interrupted in (False, True):
        disk = FakeDisk()
        storage = NodeStorage.open(disk, small_limits())
        for uid in ("gone", "kept"):
            storage.open_server(uid)
            storage.append(uid, entries(1, 30, size=40))
            storage.save_hard_state(uid, HardState(1, None, 0))
        storage.sync()
        storage.write_checkpoint("gone", Checkpoint(20, 1, 1, b"", BitMap64(), b"s"))
        storage.remove_server("gone")
        if interrupted:
            storage.write_batch()  # the forget record is durable, the files are not gone
        else:
            assert storage.sync() == [Removed("gone")]
        storage = reopen(disk)
        assert storage.servers() == ["kept"] and disk.listdir("queues") == ["kept"]
        assert storage.open_server("kept").log.last_index() == 30
        storage = reopen(disk)  # nothing of it comes back from older WAL files either
        assert storage.servers() == ["kept"]


def test_config_indexes_come_from_kinds_alone_across_segments_and_mem_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = [
        dataclasses.replace(e, kind=EntryKind.CONFIG) if e.index % 7 in (0, 3) else e
        for e in entries(1, 40, size=120)
    ]
    storage = NodeStorage.open(FakeDisk(), small_limits())
    storage.open_server("q")
    for k in range(0, 40, 5):  # several appends: the WAL rolls, segments are written
        storage.append("q", written[k : k + 5])
        storage.sync()
    log = storage.log("q")
    assert log.segment_infos() and len(log.mem)  # both places hold entries

    def no_payload(*args: object) -> None:
        raise AssertionError("a payload was read")

    monkeypatch.setattr(SegmentReader, "read", no_payload)
    monkeypatch.setattr(SegmentReader, "read_run", no_payload)
    for lo in range(1, 42, 3):
        for hi in range(lo, 43, 4):
            expected = [e.index for e in written[lo - 1 : hi - 1] if e.kind is EntryKind.CONFIG]
            assert log.config_indexes(lo, hi) == expected, (lo, hi)


def _in_thread(fn: object) -> BaseException | None:
    """Call ``fn`` in another thread; what it raised, if anything."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:
            raised.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return raised[0] if raised else None


def test_storage_is_used_from_its_owner_thread_only() -> None:
    storage = NodeStorage.open(FakeDisk(), small_limits())
    storage.open_server("q")
    assert isinstance(_in_thread(lambda: storage.log("q")), AssertionError)
    assert isinstance(_in_thread(lambda: storage.write_checkpoint("q", _cp())), AssertionError)
    assert _in_thread(lambda: (storage.take_over(), storage.log("q"))) is None
    assert isinstance(_in_thread(storage.servers), AssertionError)  # another thread again
    storage.take_over()
    assert storage.servers() == ["q"]


def _cp(index: int = 1) -> Checkpoint:
    return Checkpoint(index, 1, 0, b"", BitMap64(), b"state")


def test_a_checkpoint_is_written_off_the_owner_thread_and_finished_on_it() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    job = storage.prepare_checkpoint("q")
    # The worker touches the disk only; closing before the job is finished is a bug.
    assert _in_thread(lambda: job.write(_cp(1))) is None
    assert job.bytes == len(disk.read("queues/q/checkpoints/00000000000000000001.chk"))
    with pytest.raises(AssertionError, match="checkpoint"):
        storage.close()
    storage.finish_checkpoint(job)
    storage.close()
    assert NodeStorage.open(disk, small_limits()).open_server("q").checkpoint == _cp(1)


def test_an_idle_wal_rolls_once_so_the_mem_tables_empty() -> None:
    """The mem tables hold every entry of the current WAL file until it rolls: a server
    that stops publishing would keep up to ``wal_file_bytes_max`` of bodies in memory.
    After ``wal_idle_roll_ms`` with nothing to write the file rolls (once: a file that
    holds only hard states does not roll again), and the flush empties the mem tables."""
    limits = small_limits(wal_file_bytes_max=1 << 20, wal_idle_roll_ms=100)
    storage = NodeStorage.open(FakeDisk(), limits)
    batches: list[WalBatch] = []
    thread = WalWriter(storage.wal, batches.append)
    thread.start()
    try:
        storage.open_server("q")
        storage.save_hard_state("q", HardState(1, None, 0))
        storage.append("q", entries(1, 3, size=40))
        deadline = time.monotonic() + 10
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # five more idle periods: no further roll
    finally:
        thread.stop()
    assert [len(b.ops) > 0 for b in batches[:-1]] == [True] * (len(batches) - 1)
    idle = batches[-1]
    assert idle.ops == () and idle.rolled == batches[0].wal_seq
    for batch in batches:
        storage.complete(batch)
    assert storage.rolled_wal_files() == [idle.rolled]
    storage.flush_segments()
    assert len(storage.log("q").mem) == 0
    assert [e.index for e in storage.log("q").entries(1, 4, 1 << 20)] == [1, 2, 3]
