"""A WAL roll that carries short tails into the next file, and a segment flush of many
logs synced together: a crash at every disk operation of either loses no entry that was
reported durable, and the recovered storage flushes and reopens whole."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.limits import Limits
from engine.raft.entry import Entry
from engine.storage import NodeStorage
from engine.storage.wal_carry import CarryRuns
from tests.engine.storage.compaction.test_crash import Crash, CrashingDisk
from tests.engine.storage.conftest import entries, small_limits

SERVERS = 6


def _filled(limits: Limits) -> tuple[CrashingDisk, NodeStorage, dict[str, list[Entry]]]:
    """Servers ``s0..``: the even ones wrote one short entry (carried at a roll), the odd
    ones three (written to a segment), all durable, and a file rolled and flushed
    before, so that the roll under test is not the first."""
    disk = CrashingDisk()
    storage = NodeStorage.open(disk, limits)
    written: dict[str, list[Entry]] = {}
    for k in range(SERVERS):
        uid = f"s{k}"
        storage.open_server(uid)
        written[uid] = entries(1, 1 if k % 2 == 0 else 3, size=24, tag=uid)
        storage.append(uid, written[uid])
    storage.sync()
    if limits.segment_flush_logs_max < SERVERS:
        for k in range(0, SERVERS, 2):  # their queues sleep: unpacked for the flush
            assert storage.pack_log(f"s{k}")
    return disk, storage, written


def _roll_and_flush(storage: NodeStorage) -> None:
    batch = storage.wal.roll_if_written()
    assert batch is not None
    storage.complete(batch)
    error = storage.flush_segments()
    assert error is None


def _assert_whole(storage: NodeStorage, written: dict[str, list[Entry]]) -> None:
    for uid, expected in written.items():
        log = storage.open_server(uid).log
        assert log.entries(1, 99, 1 << 20) == expected, uid


CASES = {
    "carry": small_limits(wal_file_bytes_max=1 << 16, wal_carry_entries_max=2),
    "batched flush": small_limits(
        wal_file_bytes_max=1 << 16, wal_carry_entries_max=0, segment_flush_batch_plans_min=2
    ),
    "flush in groups": small_limits(
        wal_file_bytes_max=1 << 16, wal_carry_entries_max=0, segment_flush_logs_max=2
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_crash_at_every_disk_operation_of_a_roll_and_its_flush_loses_nothing(
    name: str,
) -> None:
    limits = CASES[name]
    disk, storage, written = _filled(limits)
    start = disk.ops
    batch = storage.wal.roll_if_written()
    assert batch is not None
    if name == "carry":
        assert set(batch.carried) == {f"s{k}" for k in range(0, SERVERS, 2)}
    storage.complete(batch)
    assert storage.flush_segments() is None
    total = disk.ops - start
    assert total > 3
    for k in range(1, total + 1):
        for tear in (False, True):
            disk, storage, written = _filled(limits)
            disk.crash_at = disk.ops + k
            with pytest.raises(Crash):
                _roll_and_flush(storage)
            disk.crash(random.Random(k) if tear else None)
            recovered = NodeStorage.open(disk, limits)
            _assert_whole(recovered, written)
            # More entries, another roll and flush, a clean close: still whole.
            for uid in written:
                more = entries(len(written[uid]) + 1, 1, size=24, tag=uid)
                recovered.append(uid, more)
                written[uid] = written[uid] + more
            recovered.sync()
            recovered.close()
            _assert_whole(NodeStorage.open(disk, limits), written)


def test_carried_entries_leave_the_flush_of_their_file_and_the_next_roll_carries_them() -> None:
    limits = CASES["carry"]
    _, storage, written = _filled(limits)
    _roll_and_flush(storage)
    for k in range(SERVERS):
        log = storage.log(f"s{k}")
        # The carried runs stay in the mem table; the others went to segments.
        assert (len(log.mem), bool(log.segment_infos())) == (
            (1, False) if k % 2 == 0 else (0, True)
        )
    assert storage.wal.roll_if_written() is None  # a file of carried runs alone stays
    storage.append("s1", entries(4, 1, size=24, tag="s1"))
    written["s1"] += entries(4, 1, size=24, tag="s1")
    storage.sync()
    _roll_and_flush(storage)  # the next roll carries them again: still no segment
    assert not storage.log("s0").segment_infos() and len(storage.log("s0").mem) == 1
    storage.append("s0", entries(2, 2, size=24, tag="s0"))
    written["s0"] += entries(2, 2, size=24, tag="s0")
    storage.sync()
    _roll_and_flush(storage)  # three entries now: to a segment
    assert storage.log("s0").segment_infos() and len(storage.log("s0").mem) == 0
    _assert_whole(storage, written)


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 3), st.booleans()), min_size=1),
    st.integers(0, 4),
)
def test_a_carried_run_is_what_the_file_wrote_to_the_log(
    appends: list[tuple[int, int, bool]], entries_max: int
) -> None:
    """Against a model: the run is the log's entries from the first index this file
    wrote, or ``None`` once over the limits or after a reset."""
    runs = CarryRuns(entries_max, 1 << 20)
    log: list[Entry] = []
    first: int | None = None
    gone = False
    for back, n, reset in appends:
        if reset:
            runs.not_carried("q")
            gone = True
            continue
        lo = max(1, len(log) + 1 - back)
        batch = entries(lo, n, term=len(log) + 1)
        log = log[: lo - 1] + batch
        first = lo if first is None else min(first, lo)
        runs.appended("q", tuple(batch))
        expected = log[first - 1 :]
        if len(expected) > entries_max:
            gone = True
        assert runs.runs["q"] == (None if gone else expected)


def test_a_file_of_more_logs_than_a_flush_takes_is_flushed_in_groups() -> None:
    """Six logs, half of them packed, two a flush: three flushes of the file, which
    stays until the last; the packed logs are packed again after theirs; a log unpacked
    from outside during a flush that does not take it keeps its rows."""
    limits = CASES["flush in groups"]
    disk, storage, written = _filled(limits)
    batch = storage.wal.roll_if_written()
    assert batch is not None
    storage.complete(batch)
    (rolled,) = storage.rolled_wal_files()
    groups: list[list[str]] = []
    while (flush := storage.prepare_segment_flush()) is not None:
        groups.append(sorted(uid for uid, *_ in flush.plans))
        assert len(flush.plans) <= 2
        if len(groups) == 1:
            taken = {uid for uid, *_ in flush.plans}
            woken = next(f"s{k}" for k in range(0, SERVERS, 2) if f"s{k}" not in taken)
            assert len(storage.log(woken).mem) == 1  # unpacked for good, rows unflushed
        flush.write()
        storage.finish_segment_flush(flush)
        if len(groups) < 3:
            assert storage.rolled_wal_files() == [rolled], groups
    assert len(groups) == 3 and sorted(uid for group in groups for uid in group) == sorted(written)
    assert storage.rolled_wal_files() == []
    packed = [uid for uid in written if storage.log_packed(uid)]
    assert len(packed) == 2 and woken not in packed
    _assert_whole(storage, written)
    storage.close()
    _assert_whole(NodeStorage.open(disk, limits), written)
