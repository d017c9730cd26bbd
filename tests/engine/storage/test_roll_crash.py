"""A segment flush of many logs synced together: a crash at every disk operation of a
roll and its flush loses no entry that was reported durable, and the recovered storage
flushes and reopens whole."""

from __future__ import annotations

import random

import pytest

from engine.limits import Limits
from engine.raft.entry import Entry
from engine.storage import NodeStorage
from tests.engine.storage.compaction.test_crash import Crash, CrashingDisk
from tests.engine.storage.conftest import entries, small_limits

SERVERS = 6


def _filled(limits: Limits) -> tuple[CrashingDisk, NodeStorage, dict[str, list[Entry]]]:
    """Servers ``s0..``: the even ones wrote one short entry, the odd ones three, all
    durable."""
    disk = CrashingDisk()
    storage = NodeStorage.open(disk, limits)
    written: dict[str, list[Entry]] = {}
    for k in range(SERVERS):
        uid = f"s{k}"
        storage.open_server(uid)
        written[uid] = entries(1, 1 if k % 2 == 0 else 3, size=24, tag=uid)
        storage.append(uid, written[uid])
    storage.sync()
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
    "batched flush": small_limits(wal_file_bytes_max=1 << 16, segment_flush_batch_plans_min=2),
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
