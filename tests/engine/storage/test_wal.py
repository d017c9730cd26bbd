from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from engine.errors import StorageFailed
from engine.storage import FakeDisk, HardState, HardStateSaved, NodeStorage, Persisted, WriteFailed
from engine.storage.disk import OsDisk
from engine.storage.wal import wal_path
from tests.engine.storage.conftest import entries, small_limits


def test_group_commit_makes_every_server_durable_with_one_sync() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(
        disk, small_limits(wal_file_bytes_max=1 << 20, wal_batch_bytes_max=1 << 16)
    )
    for k in range(10):
        storage.open_server(f"q{k}")
    storage.save_hard_state("q0", HardState(2, "q1", 0))
    for k in range(10):
        storage.append(f"q{k}", entries(1, 3))
    syncs_before = disk.syncs
    batch = storage.write_batch()
    assert disk.syncs == syncs_before + 1 and not storage.wal.pending()
    events = storage.complete(batch)
    assert events[0] == HardStateSaved("q0", HardState(2, "q1", 0))
    assert events[1:] == [Persisted(f"q{k}", 3, 1) for k in range(10)]
    assert [storage.log(f"q{k}").last_index() for k in range(10)] == [3] * 10


def test_a_batch_stops_at_the_batch_byte_limit() -> None:
    storage = NodeStorage.open(
        FakeDisk(), small_limits(wal_batch_bytes_max=512, wal_file_bytes_max=1 << 20)
    )
    storage.open_server("q")
    for i in range(1, 11):
        storage.append("q", entries(i, 1, size=100))
    sizes = []
    while storage.wal.pending():
        sizes.append(len(storage.write_batch().ops))
    assert sum(sizes) == 10 and max(sizes) < 10


def test_wal_rolls_and_old_files_are_deleted_after_the_segment_flush() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.save_hard_state("q", HardState(3, None, 0))
    for i in range(10):
        storage.append("q", entries(1 + 10 * i, 10, size=40))
        storage.sync()
    assert len(disk.listdir("wal")) == 1 and storage.wal.seq > 1
    assert len(disk.listdir("queues/q/segments")) >= 2
    disk.crash()
    storage = NodeStorage.open(disk, small_limits())
    rec = storage.open_server("q")
    assert rec.hard_state == HardState(3, None, 0)  # carried into every new WAL file
    assert [e.index for e in rec.log.entries(1, 200, 1 << 20)] == list(range(1, 101))


def test_torn_tail_is_cut_and_never_served() -> None:
    for seed in range(30):
        disk = FakeDisk()
        storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
        storage.open_server("q")
        storage.append("q", entries(1, 5))
        storage.sync()
        storage.append("q", entries(6, 5, size=200))
        batch = storage.write_batch()
        disk.crash(random.Random(seed))  # the batch may be torn anywhere
        del batch
        storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
        log = storage.open_server("q").log
        got = log.entries(1, 100, 1 << 20)
        assert got == (entries(1, 5) + entries(6, 5, size=200))[: len(got)]
        assert log.last_index() >= 5


def test_unsynced_batch_is_lost_whole_on_crash_without_tearing() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 2))
    storage.sync()
    storage.append("q", entries(3, 2))  # submitted, never written
    disk.crash()
    storage = NodeStorage.open(disk, small_limits())
    assert storage.open_server("q").log.last_index() == 2


def test_corruption_before_valid_data_puts_every_server_into_repair() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    storage.open_server("q")
    for i in range(1, 4):
        storage.append("q", entries(i, 1, size=64))
        storage.sync()
    disk.flip_bit(wal_path(1), 8 * 120)  # inside an early record; later batches are valid
    disk.crash()
    rec = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20)).open_server("q")
    assert rec.repairing and rec.repair_reason and "corrupt at byte" in rec.repair_reason
    assert rec.log.last_index() < 3, "what followed the corrupt record is left out"


def test_disk_full_fails_the_batch_cleanly_and_keeps_what_is_durable() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    storage.open_server("a")
    storage.open_server("b")
    storage.append("a", entries(1, 3))
    storage.sync()
    disk.space_bytes = disk.used_bytes() + 10
    storage.append("a", entries(4, 3))
    storage.append("b", entries(1, 1))
    events = storage.sync()
    assert [type(e) for e in events] == [WriteFailed, WriteFailed]
    with pytest.raises(StorageFailed):
        storage.append("a", entries(4, 1))
    assert storage.log("a").last_index() == 3
    disk.space_bytes = None
    storage.open_server("c")
    storage.append("c", entries(1, 1))
    assert storage.sync() == [Persisted("c", 1, 1)]  # the node stays up
    disk.crash()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    assert storage.open_server("a").log.entries(1, 10, 1 << 20) == entries(1, 3)
    assert storage.open_server("b").log.last_index() == 0
    assert storage.open_server("c").log.last_index() == 1


def test_io_error_on_sync_fails_the_batch() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    storage.open_server("a")
    storage.append("a", entries(1, 1))
    disk.fail_errno = errno.EIO
    events = storage.sync()
    assert isinstance(events[0], WriteFailed) and "WAL" in events[0].error.detail
    disk.fail_errno = None
    disk.crash()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=1 << 20))
    assert storage.open_server("a").log.last_index() == 0


def test_a_failed_segment_flush_loses_nothing_and_is_retried() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    for i in range(4):
        storage.append("q", entries(1 + 10 * i, 10, size=40))
        while storage.wal.pending():
            storage.complete(storage.write_batch())
    assert storage.rolled_wal_files()
    disk.fail_errno = errno.ENOSPC
    error = storage.flush_segments()
    assert isinstance(error, StorageFailed) and "segment flush" in error.detail
    assert disk.listdir("queues/q/segments") == []
    assert storage.log("q").entries(1, 41, 1 << 20) == [
        e for i in range(4) for e in entries(1 + 10 * i, 10, size=40)
    ]
    disk.fail_errno = None
    assert storage.flush_segments() is None and storage.rolled_wal_files() == []
    disk.crash()
    storage = NodeStorage.open(disk, small_limits())
    assert [e.index for e in storage.open_server("q").log.entries(1, 99, 1 << 20)] == list(
        range(1, 41)
    )


class _RefusingDisk(OsDisk):
    """Refuses the renames into one server's directory while ``refuse`` names it."""

    refuse: str | None = None

    def rename(self, src: str, dst: str) -> None:
        if self.refuse is not None and dst.startswith(f"queues/{self.refuse}/"):
            raise OSError(errno.EIO, "refused")
        super().rename(src, dst)


def _fill(storage: NodeStorage, servers: int) -> None:
    for k in range(servers):
        storage.open_server(f"q{k:02d}")
    for i in range(3):
        for k in range(servers):
            storage.append(f"q{k:02d}", entries(1 + 5 * i, 5, size=40, tag=f"q{k}."))
        while storage.wal.pending():
            storage.complete(storage.write_batch())
    storage._rolled.append(storage.wal.roll())


def test_a_flush_of_many_servers_writes_them_on_several_threads(tmp_path: Path) -> None:
    """On a real disk the servers' segments are written by several threads; each log
    gets exactly its entries, in order; a refusal of one server's writes removes every
    segment of the flush and loses nothing, and the retry writes them all."""
    limits = small_limits(
        wal_file_bytes_max=1 << 20, segment_entries_max=8, segment_flush_writers_max=8
    )
    disk = _RefusingDisk(str(tmp_path))
    assert disk.concurrent and not FakeDisk.concurrent
    storage = NodeStorage.open(disk, limits)
    _fill(storage, 40)
    disk.refuse = "q17"
    error = storage.flush_segments()
    assert isinstance(error, StorageFailed)
    # (The refused rename's temporary file stays, as with one thread: the retry
    # overwrites it.)
    segments = [n for k in range(40) for n in disk.listdir(f"queues/q{k:02d}/segments")]
    assert [n for n in segments if not n.endswith(".tmp")] == []
    disk.refuse = None
    assert storage.flush_segments() is None and storage.rolled_wal_files() == []
    storage.close()
    storage = NodeStorage.open(_RefusingDisk(str(tmp_path)), limits)
    for k in range(40):
        log = storage.open_server(f"q{k:02d}").log
        assert log.entries(1, 99, 1 << 20) == entries(1, 15, size=40, tag=f"q{k}.")
        assert len(disk.listdir(f"queues/q{k:02d}/segments")) == 2  # 15 entries, 8 a segment
