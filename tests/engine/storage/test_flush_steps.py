"""The steps of a segment flush as the runtime takes them: the WAL file stays rolled, on
disk, until its delete (which may run off the node's thread) is done and recorded."""

from __future__ import annotations

import errno

import pytest

from engine.errors import StorageFailed
from engine.storage import HardState, NodeStorage, SegmentFlush
from engine.storage.disk import FakeDisk
from engine.storage.wal import wal_path
from tests.engine.storage.conftest import entries, small_limits


def _rolled_storage(disk: FakeDisk) -> NodeStorage:
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.save_hard_state("q", HardState(1, None, 6))
    storage.append("q", entries(1, 6, size=300))
    while storage.wal.pending():
        storage.complete(storage.write_batch())
    assert storage.rolled_wal_files()
    return storage


def _shown_flush(disk: FakeDisk) -> tuple[NodeStorage, int, SegmentFlush]:
    """A storage whose first rolled WAL file's segments are written and shown."""
    storage = _rolled_storage(disk)
    seq = storage.rolled_wal_files()[0]
    flush = storage.prepare_segment_flush()
    assert flush is not None
    flush.write()
    assert storage.show_flushed(flush)
    return storage, seq, flush


def test_the_wal_file_stays_until_its_delete_is_done_and_recorded() -> None:
    disk = FakeDisk()
    storage, seq, flush = _shown_flush(disk)
    # Shown: the entries read from segments, the file still on disk and rolled.
    assert storage.log("q").entries(1, 7, 1 << 20) == entries(1, 6, size=300)
    assert disk.exists(wal_path(seq)) and storage.rolled_wal_files()[0] == seq
    flush.remove_wal_file()
    assert not disk.exists(wal_path(seq)) and storage.rolled_wal_files()[0] == seq
    storage.wal_file_removed(flush)
    assert seq not in storage.rolled_wal_files()
    assert storage.log("q").entries(1, 7, 1 << 20) == entries(1, 6, size=300)


def test_a_failed_delete_leaves_the_file_rolled_and_the_next_flush_deletes_it() -> None:
    disk = FakeDisk()
    storage, seq, flush = _shown_flush(disk)
    disk.fail_errno = errno.EIO
    with pytest.raises(StorageFailed):
        flush.remove_wal_file()
    disk.fail_errno = None
    assert storage.rolled_wal_files()[0] == seq
    assert storage.flush_segments() is None
    assert seq not in storage.rolled_wal_files() and not disk.exists(wal_path(seq))
    assert storage.log("q").entries(1, 7, 1 << 20) == entries(1, 6, size=300)
