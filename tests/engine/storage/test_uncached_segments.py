"""Segments written past the page cache: a follower's copies leave it once synced, their
headers and indexes stay, and every byte still reads back as written."""

from __future__ import annotations

import dataclasses
import mmap
import os
from pathlib import Path

from engine.limits import DEFAULT_LIMITS, KIB
from engine.storage import HardState, NodeStorage
from engine.storage.disk import OsDisk, write_file_atomic
from tests.engine.storage.conftest import entries
from tests.engine.storage.pagecache import resident


def test_write_file_atomic_not_cached_drops_the_tail_and_keeps_the_head(tmp_path: Path) -> None:
    disk = OsDisk(str(tmp_path))
    head = os.urandom(3 * mmap.PAGESIZE + 100)
    tail = [os.urandom(70_000) for _ in range(60)]  # about 1000 pages
    pages = -(-(len(head) + 70_000 * 60) // mmap.PAGESIZE)
    write_file_atomic(disk, "kept", head, tail)
    write_file_atomic(disk, "dropped", head, tail, cached=False)
    assert resident(tmp_path / "kept") == [True] * pages
    # The page the head ends in stays, whole: only pages wholly past it are dropped.
    assert resident(tmp_path / "dropped") == [True] * 4 + [False] * (pages - 4)
    assert disk.read("dropped") == head + b"".join(tail) == disk.read("kept")


def test_a_followed_logs_segment_payloads_leave_the_page_cache(tmp_path: Path) -> None:
    """Flushed with ``uncached``, a log's segments keep their header and index pages in
    the cache and drop the pages wholly past them; another log's stay whole; both read
    back every entry as written."""
    limits = dataclasses.replace(DEFAULT_LIMITS, wal_file_bytes_max=64 * KIB)
    storage = NodeStorage.open(OsDisk(str(tmp_path)), limits)
    written = {uid: entries(1, 12, size=16 * KIB, tag=uid) for uid in ("led", "followed")}
    for uid, log in written.items():
        storage.open_server(uid)
        storage.save_hard_state(uid, HardState(1, None, 12))
        storage.append(uid, log)
    while storage.wal.pending():
        storage.complete(storage.write_batch())
    assert storage.rolled_wal_files()
    while (flush := storage.prepare_segment_flush({"followed"}.__contains__)) is not None:
        flush.write()
        storage.finish_segment_flush(flush)
    for uid, log in written.items():
        infos = [info for info, _ in storage.log(uid).segment_infos()]
        assert infos
        for info in infos:
            pages = resident(tmp_path / info.path)
            head = info.data_offset // mmap.PAGESIZE + 1  # the pages the index reaches
            assert all(pages[:head]), (info.path, pages)
            assert (uid == "followed") == (not any(pages[head:])), (info.path, pages)
        back = storage.log(uid).entries(1, 13, 1 << 30)
        assert [(e.index, e.term, e.data) for e in back] == [(e.index, e.term, e.data) for e in log]
    storage.close()
