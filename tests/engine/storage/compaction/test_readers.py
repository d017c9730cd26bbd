"""Readers and the segment writer against compaction: a pinned segment stays on disk until
released, a reader racing compaction in another thread reads every entry it was promised,
and segments written while a compaction runs are never touched by it."""

from __future__ import annotations

import random
import threading

from pyroaring import BitMap64

from engine.raft.entry import Entry, EntryKind
from engine.storage import FakeDisk
from engine.storage.reaper import PinnedReader
from tests.engine.storage.compaction.conftest import (
    UID,
    assert_intact,
    assert_no_orphans,
    checkpoint,
    fill,
    limits,
    payload,
    reopen,
)

LIMITS = limits()


def test_a_pinned_segment_outlives_compaction_until_released() -> None:
    disk = FakeDisk()
    storage = fill(disk, LIMITS, 96)
    live = BitMap64(range(4, 97, 9))
    checkpoint(storage, 96, live)
    storage.compact(UID, 1)
    before = sorted(disk.listdir(f"queues/{UID}/segments"))
    with storage.pin_reader(UID) as reader:
        result = storage.compact(UID, 3)
        assert result.phases == (3,) and result.deferred_files == len(before)
        on_disk = disk.listdir(f"queues/{UID}/segments")
        assert set(before) < set(on_disk) and any(n.endswith(".cmp") for n in on_disk)
        for index in range(1, 97):  # dead entries too: the reader holds the old files
            assert reader.read(index).data == payload(index)
        for index in live:
            assert storage.log(UID).read(index).data == payload(index)
    assert not storage.pins.count()
    assert_no_orphans(storage)
    assert_intact(storage, live, 96)


def test_a_crash_while_a_reader_holds_segments_leaves_no_orphans() -> None:
    disk = FakeDisk()
    storage = fill(disk, LIMITS, 96)
    live = BitMap64(range(4, 97, 9))
    checkpoint(storage, 96, live)
    storage.compact(UID, 1)
    reader = storage.pin_reader(UID)
    assert storage.compact(UID, 3).deferred_files > 0
    assert reader.read(5).data == payload(5)
    disk.crash()  # the reader never released: its files and the intents are still there
    recovered = reopen(disk, LIMITS)
    assert_intact(recovered, live, 96)
    assert len(recovered.log(UID).segment_infos()) == 1


def test_a_reader_thread_racing_compaction_reads_every_promised_entry() -> None:
    disk = FakeDisk()
    storage = fill(disk, LIMITS, 400)
    rng = random.Random(7)
    live = BitMap64(range(1, 394))
    errors: list[BaseException] = []
    for rounds in range(1, 7):
        promised = BitMap64(live)
        # acks in random order: the next checkpoint drops a third of what is live
        for index in rng.sample(list(live), len(live) // 3):
            live.discard(index)
        checkpoint(storage, 393 + rounds, live)
        reader = storage.pin_reader(UID)
        stop = threading.Event()

        thread = threading.Thread(target=_read_all, args=(reader, promised, stop, errors))
        thread.start()
        job = storage.prepare_compaction(UID, "auto")
        worker = threading.Thread(target=job.run)
        worker.start()
        worker.join()
        storage.finish_compaction(job)
        stop.set()
        thread.join()
        reader.release()
        assert not errors, errors
        assert_intact(storage, live, 393 + rounds)
    assert_intact(reopen(disk, LIMITS), live, 399)


def _read_all(
    reader: PinnedReader, want: BitMap64, stop: threading.Event, errors: list[BaseException]
) -> None:
    try:
        while not stop.is_set():
            for index in want:
                assert reader.read(index).data == payload(index)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_segments_written_during_a_compaction_are_left_alone() -> None:
    lim = limits(wal_file_bytes_max=2048, wal_batch_bytes_max=1024)
    disk = FakeDisk()
    storage = fill(disk, lim, 128)
    live = BitMap64(range(2, 129, 10))
    checkpoint(storage, 128, live)
    storage.compact(UID, 1)
    job = storage.prepare_compaction(UID, 3)
    assert job.groups
    # the segment writer flushes new entries while the job is planned but not run
    for lo in range(129, 329, 8):
        storage.append(
            UID, [Entry(i, 1, EntryKind.COMMAND, i, payload(i)) for i in range(lo, lo + 8)]
        )
        storage.sync()
    assert storage.rolled_wal_files() == []
    written = {i.path for i, _ in storage.log(UID).segment_infos() if i.lo > 128}
    assert written
    outputs = {f"queues/{UID}/segments/{g.out_seq:08d}.seg" for g in job.groups}
    assert not outputs & written
    job.run()
    storage.finish_compaction(job)
    assert written <= {i.path for i, _ in storage.log(UID).segment_infos()}
    assert_intact(storage, live, 128)
    assert_intact(reopen(disk, lim), live, 128)
