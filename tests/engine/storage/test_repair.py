"""Damage found by recovery or by a read: the log is cut before the first entry that
cannot be trusted (it stays a prefix) or the server is reset to an empty log, and it is
marked repairing; the marker, and the cut, survive crashes until ``finish_repair``."""

from __future__ import annotations

import pytest
from pyroaring import BitMap64

from engine.errors import EntryDamaged, RecoveryRefused
from engine.storage import Checkpoint, FakeDisk, HardState, NodeStorage
from engine.storage.repair import RepairKind, RepairMarker, decode_marker, encode_marker
from engine.storage.wal import wal_path
from tests.engine.storage.conftest import entries, one_server, small_limits

BIG_WAL = 1 << 20


def reopen(disk: FakeDisk, **change: int) -> NodeStorage:
    disk.crash()
    return NodeStorage.open(disk, small_limits(**change))


def indexes(storage: NodeStorage, uid: str = "q") -> list[tuple[int, int]]:
    log = storage.log(uid)
    got = log.entries(log.first_index(), log.last_index() + 1, 1 << 30)
    return [(e.index, e.term) for e in got]


def segments(disk: FakeDisk, uid: str = "q") -> list[str]:
    d = f"queues/{uid}/segments"
    return [f"{d}/{n}" for n in disk.listdir(d) if n.endswith(".seg")]


def test_a_marker_round_trips_and_a_damaged_one_reads_as_a_reset() -> None:
    m = RepairMarker(RepairKind.WAL, 7, 5, 2, 3, 4, 9, "why")
    data = encode_marker(m)
    assert decode_marker(data, 99) == m
    for bit in range(0, len(data) * 8, 37):
        broken = bytearray(data)
        broken[bit // 8] ^= 1 << (bit % 8)
        got = decode_marker(bytes(broken), 99)
        assert got.kind is RepairKind.RESETTING and got.wal_seq == 99


def test_a_corrupt_entry_after_the_checkpoint_cuts_the_log_before_it_until_repaired() -> None:
    disk = FakeDisk()
    storage = one_server(disk, entries(1, 40, size=40), HardState(1, "a", 40))
    storage.write_checkpoint("q", Checkpoint(6, 1, 1, b"", BitMap64([2, 5]), b"s"))
    seg = segments(disk)[2]
    assert storage.log("q").segment_infos()[2][0].hi == 12
    disk.flip_bit(seg, 8 * (len(disk.read(seg)) - 2))  # in entry 12
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.repairing and "entry 12 fails" in str(rec.repair_reason)
    assert rec.checkpoint is not None and rec.checkpoint.index == 6
    assert rec.log.last_index() == 11
    # What the server writes during its repair replaces the cut tail, across crashes.
    storage.append("q", entries(12, 3, term=2))
    storage.sync()
    for _ in range(2):
        storage = reopen(disk)
        rec = storage.open_server("q")
        assert rec.repairing and indexes(storage)[-4:] == [(11, 1), (12, 2), (13, 2), (14, 2)]
    # Repaired: the marker goes once no WAL file from before the repair remains.
    storage.save_hard_state("q", HardState(2, "a", 14))  # the core leaves repair
    storage.sync()
    storage.flush_segments()
    assert storage.finish_repair("q") and not disk.exists("queues/q/repair")
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert not rec.repairing and indexes(storage)[-4:] == [(11, 1), (12, 2), (13, 2), (14, 2)]


def test_the_marker_stays_while_a_wal_file_from_before_the_repair_remains() -> None:
    disk = FakeDisk()
    storage = one_server(
        disk, entries(1, 3), HardState(1, None, 3), small_limits(wal_file_bytes_max=BIG_WAL)
    )
    reopen(disk, wal_file_bytes_max=BIG_WAL)  # the new WAL file carries the hard state
    disk.crash()
    f = disk.open(wal_path(1))
    f.truncate(20)  # the entries are gone, as if the media lost them
    f.sync()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=BIG_WAL))
    assert storage.open_server("q").repairing
    assert storage.rolled_wal_files() == [1, 2]
    assert not storage.finish_repair("q"), "WAL file 1 would replay without the cut"
    assert storage.repairing("q")
    assert storage.flush_segments() is None
    assert not storage.repairing("q") and not disk.exists("queues/q/repair")


def test_a_server_removed_while_its_marker_waits_leaves_the_flush_working() -> None:
    disk = FakeDisk()
    storage = one_server(
        disk, entries(1, 3), HardState(1, None, 3), small_limits(wal_file_bytes_max=BIG_WAL)
    )
    reopen(disk, wal_file_bytes_max=BIG_WAL)
    disk.crash()
    f = disk.open(wal_path(1))
    f.truncate(20)
    f.sync()
    storage = NodeStorage.open(disk, small_limits(wal_file_bytes_max=BIG_WAL))
    assert storage.open_server("q").repairing
    assert not storage.finish_repair("q")  # waits for WAL file 1 to go
    storage.remove_server("q")
    storage.sync()
    assert storage.flush_segments() is None
    assert storage.rolled_wal_files() == [] and not disk.exists("queues/q")


def test_a_damaged_segment_header_resets_the_server_and_old_wal_entries_stay_gone() -> None:
    disk = FakeDisk()
    storage = one_server(disk, entries(1, 30, size=40), HardState(3, "b", 30))
    storage.append("q", entries(31, 2, size=40))  # still in the WAL at the crash
    storage.sync()
    disk.flip_bit(segments(disk)[1], 8 * 20)
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.repairing and "segment" in str(rec.repair_reason)
    assert rec.log.last_index() == 0 and rec.checkpoint is None and segments(disk) == []
    assert rec.hard_state == HardState(3, "b", 30), "term and vote are kept"
    # A snapshot from the leader, installed during the repair, survives a crash.
    storage.install_snapshot(
        "q", Checkpoint(40, 4, 1, b"", BitMap64([38]), b"leader"), [entries(38, 1, term=4)[0]]
    )
    storage.sync()
    storage.append("q", entries(41, 2, term=4))
    storage.sync()
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.repairing and rec.checkpoint is not None and rec.checkpoint.state == b"leader"
    assert indexes(storage) == [(41, 4), (42, 4)] and storage.log("q").read(38).term == 4


def test_a_lost_live_entry_before_the_checkpoint_resets_a_lost_dead_one_restarts_after_it() -> None:
    for live, reset in ((BitMap64([3, 9]), True), (BitMap64([3]), False)):
        disk = FakeDisk()
        storage = NodeStorage.open(disk, small_limits())
        storage.open_server("q")
        storage.append("q", entries(1, 40, size=40))
        storage.sync()
        mem = storage.log("q").mem
        assert not len(mem) or mem.lo > 12, "entries up to the checkpoint are in segments"
        storage.write_checkpoint("q", Checkpoint(12, 1, 1, b"", live, b"s"))
        error = EntryDamaged("entry 9 fails its CRC32C check", index=9)
        storage.mark_damaged("q", error)  # found by a read while serving
        storage = reopen(disk)
        rec = storage.open_server("q")
        assert rec.repairing
        if reset:
            assert rec.checkpoint is None and rec.log.last_index() == 0
        else:
            assert rec.checkpoint is not None and rec.log.snapshot_index() == 12
            assert rec.log.last_index() == 12 and rec.log.read(3).index == 3


def test_a_damaged_checkpoint_falls_back_to_an_older_one_a_damaged_snapshot_resets() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 20, size=40))
    storage.sync()
    storage.write_checkpoint("q", Checkpoint(8, 1, 1, b"", BitMap64([2]), b"old"))
    storage.write_checkpoint("q", Checkpoint(16, 1, 1, b"", BitMap64([2]), b"new"))
    disk.flip_bit("queues/q/checkpoints/" + disk.listdir("queues/q/checkpoints")[-1], 100)
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert not rec.repairing and rec.checkpoint is not None and rec.checkpoint.state == b"old"
    storage.release_cursor("q", 8)
    disk.flip_bit("queues/q/snapshots/" + disk.listdir("queues/q/snapshots")[0], 100)
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.repairing and "snapshot at index 8 is damaged" in str(rec.repair_reason)
    assert rec.checkpoint is None and rec.log.last_index() == 0


def test_after_a_corrupt_wal_record_every_server_keeps_what_preceded_it() -> None:
    disk = FakeDisk()
    limits = {"wal_file_bytes_max": BIG_WAL}
    storage = NodeStorage.open(disk, small_limits(**limits))
    for uid in ("a", "b"):
        storage.open_server(uid)
    storage.append("a", entries(1, 4, size=64))
    storage.save_hard_state("a", HardState(1, "x", 4))
    storage.sync()
    mark = len(disk.read(wal_path(1)))
    storage.append("a", entries(5, 4, size=64))
    storage.append("b", entries(1, 4, size=64))
    storage.sync()
    storage.save_hard_state("a", HardState(2, "y", 8))  # after the damage: lost with it
    storage.sync()
    disk.flip_bit(wal_path(1), 8 * (mark + 40))  # in the batch after the mark
    storage = reopen(disk, **limits)
    a, b = storage.open_server("a"), storage.open_server("b")
    assert a.repairing and b.repairing and "corrupt at byte" in str(a.repair_reason)
    assert a.log.last_index() == 4 and b.log.last_index() == 0
    assert a.hard_state == HardState(1, "x", 4)
    storage.append("a", entries(5, 1, term=2))
    storage.sync()
    storage = reopen(disk, **limits)  # the corrupt file is still there: the same cut
    assert storage.open_server("a").repairing and indexes(storage, "a")[-2:] == [(4, 1), (5, 2)]
    assert storage.flush_segments() is None  # the corrupt file goes to segments, then away
    storage = reopen(disk, **limits)
    assert indexes(storage, "a")[-2:] == [(4, 1), (5, 2)] and storage.open_server("b").repairing


def test_after_a_corrupt_wal_record_a_newer_checkpoint_limits_what_is_trusted() -> None:
    """Entries after the commit index known at the corrupt record may be older versions
    of entries rewritten in the lost part; a checkpoint past that index counts them
    committed, so the log restarts after the checkpoint (none of its live entries is
    among them) or is reset (one is)."""
    for live, reset in ((BitMap64([2]), False), (BitMap64([2, 6]), True)):
        disk = FakeDisk()
        limits = {"wal_file_bytes_max": BIG_WAL}
        storage = NodeStorage.open(disk, small_limits(**limits))
        storage.open_server("q")
        storage.append("q", entries(1, 8, size=64))
        storage.save_hard_state("q", HardState(1, None, 4))
        storage.close()  # entries 1 .. 8 go to segments
        storage = NodeStorage.open(disk, small_limits(**limits))
        storage.open_server("q")
        current = wal_path(storage.wal.seq)
        mark = len(disk.read(current))
        storage.append("q", entries(9, 2, size=64))
        storage.sync()
        storage.write_checkpoint("q", Checkpoint(7, 1, 1, b"", live, b"s"))
        storage.save_hard_state("q", HardState(1, None, 10))  # a valid batch follows
        storage.sync()
        disk.flip_bit(current, 8 * (mark + 40))
        storage = reopen(disk, **limits)
        rec = storage.open_server("q")
        assert rec.repairing
        if reset:
            assert rec.checkpoint is None and rec.log.last_index() == 0
        else:
            assert rec.checkpoint is not None and rec.log.snapshot_index() == 7
            assert rec.log.last_index() == 7


def test_a_server_that_cannot_be_repaired_is_refused_and_its_files_are_left_alone() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    for i in range(1, 31, 3):  # several batches, so the WAL rolls into segments
        storage.append("q", entries(i, 3, size=40))
        storage.sync()
    damaged = segments(disk)[1]
    disk.flip_bit(damaged, 8 * 20)
    files = {p: disk.read(p) for p in segments(disk)}
    storage = reopen(disk)
    with pytest.raises(RecoveryRefused, match="no other member to repair it from"):
        storage.open_server("q", repairable=False)
    assert {p: disk.read(p) for p in segments(disk)} == files
    assert not disk.exists("queues/q/repair")
    assert storage.open_server("q").repairing  # once it has peers, it is repaired
