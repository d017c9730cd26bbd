"""A server's checkpoint, snapshot and page directories are made with their first file,
not when it opens (``engine.storage.disk.ensure_dir``): opening a server that has none
makes and lists none of them, and what is written into them survives a crash."""

from __future__ import annotations

from pyroaring import BitMap64

from engine.storage import Checkpoint, FakeDisk, HardState, NodeStorage
from engine.storage.page_files import PageFiles
from tests.engine.storage.conftest import entries, small_limits


def reopen(disk: FakeDisk) -> NodeStorage:
    disk.crash()
    return NodeStorage.open(disk, small_limits())


def test_a_new_server_holds_only_what_was_written() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    assert disk.exists("queues/q") and disk.listdir("queues/q") == []
    storage.append("q", entries(1, 12, size=40))
    storage.save_hard_state("q", HardState(1, "q", 12))
    storage.sync()
    assert disk.listdir("queues/q") == [], "the entries are in the WAL"
    storage.close()  # rolls the WAL: its entries go to a segment
    assert disk.listdir("queues/q") == ["segments"]
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.checkpoint is None and rec.log.last_index() == 12
    assert disk.listdir("queues/q") == ["segments"], "opening made no directory"


def test_checkpoints_and_the_snapshot_make_their_directories_and_survive_a_crash() -> None:
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server("q")
    storage.append("q", entries(1, 40, size=40))
    storage.save_hard_state("q", HardState(1, "q", 40))
    storage.sync()
    cp = Checkpoint(30, 1, 1, b"cfg", BitMap64([3, 17]), b"state")
    storage.write_checkpoint("q", cp)
    assert disk.listdir("queues/q") == ["checkpoints", "segments"]
    storage = reopen(disk)
    assert storage.open_server("q").checkpoint == cp
    assert storage.release_cursor("q", 35) == 30
    assert disk.listdir("queues/q") == ["checkpoints", "segments", "snapshots"]
    storage = reopen(disk)
    rec = storage.open_server("q")
    assert rec.checkpoint == cp and rec.log.snapshot_index() == 30


def test_page_files_make_their_directory_with_the_first_page_or_pin() -> None:
    disk = FakeDisk()
    files = PageFiles(disk, "q1")
    assert not disk.exists("queues/q1/pages")
    handle = files.store(b"page")
    assert disk.listdir("queues/q1/pages") == [f"{handle:020d}.page"]
    files.pin(9, [handle])
    files.sync(9)
    disk.crash()
    again = PageFiles(disk, "q1", live=[handle])
    assert again.load(handle) == b"page" and again.pinned() == frozenset([handle])

    other = PageFiles(disk, "q2")
    other.pin(4, [])  # a checkpoint that names no page still writes its pin file
    other.sync(4)
    disk.crash()
    assert disk.listdir("queues/q2/pages") == [f"{4:020d}.pin"]
