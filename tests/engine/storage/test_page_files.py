"""Page files: the spilled pages of a queue's ready index on disk
(``engine.storage.page_files``)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import PageDamaged, StorageFailed
from engine.limits import Limits
from engine.queue import CheckedOut, NewMessage, QueueMachine, encode_checkout, encode_enqueue
from engine.queue.paging import NodePages, Paging
from engine.queue.snapshots import page_handles_of
from engine.raft.entry import Entry, EntryKind
from engine.raft.state_machine import ApplyMeta
from engine.storage import FakeDisk, HardState, NodeStorage, OsDisk
from engine.storage.page_files import HEADER_BYTES, PageFiles, StoredLogReader, pages_dir
from tests.engine.storage.conftest import small_limits

UID = "q1"


def page_bytes(seed: int, size: int = 300) -> bytes:
    return bytes((seed + k) % 251 for k in range(size))


def test_a_stored_page_loads_back_as_stored() -> None:
    files = PageFiles(FakeDisk(), UID)
    handles = [files.store(page_bytes(k)) for k in range(5)]
    assert handles == sorted(set(handles))
    assert [files.load(h) for h in handles] == [page_bytes(k) for k in range(5)]
    assert files.files() == 5


@pytest.mark.parametrize("bit", [0, 8 * 12, 8 * HEADER_BYTES - 1, 8 * (HEADER_BYTES + 150)])
def test_a_flipped_bit_anywhere_is_detected_by_crc(bit: int) -> None:
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    handle = files.store(page_bytes(1))
    disk.flip_bit(f"{pages_dir(UID)}/{handle:020d}.page", bit)
    with pytest.raises(PageDamaged) as caught:
        files.load(handle)
    assert caught.value.handle == handle


def test_a_torn_missing_or_misnamed_page_is_damaged() -> None:
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    a, b, c = (files.store(page_bytes(k)) for k in range(3))
    f = disk.open(f"{pages_dir(UID)}/{a:020d}.page")
    f.truncate(HEADER_BYTES + 10)
    disk.remove(f"{pages_dir(UID)}/{b:020d}.page")
    disk.rename(f"{pages_dir(UID)}/{c:020d}.page", f"{pages_dir(UID)}/{b:020d}.page")
    for handle in (a, b, c):
        with pytest.raises(PageDamaged):
            files.load(handle)


def test_pinned_pages_survive_their_drop_until_no_checkpoint_names_them() -> None:
    files = PageFiles(FakeDisk(), UID)
    a, b, c = (files.store(page_bytes(k)) for k in range(3))
    files.pin(10, [a, b])
    files.pin(20, [b])
    files.drop(a)
    files.drop(b)
    files.drop(c)
    assert files.files() == 2
    files.retain([20])  # checkpoint 10 was thinned out
    assert files.files() == 1 and files.load(b) == page_bytes(1)
    files.unpin(20)
    assert files.files() == 0


def test_pages_a_checkpoint_names_survive_a_crash_and_others_are_collected() -> None:
    """``sync`` makes a checkpoint's pages and its pin file durable; a crash loses the
    unsynced pages, and the next open deletes every page no checkpoint names but those
    the restored machine holds."""
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    kept = [files.store(page_bytes(k)) for k in range(3)]
    files.pin(7, kept)
    files.sync(7)
    later = [files.store(page_bytes(10 + k)) for k in range(2)]  # never synced
    disk.crash()
    again = PageFiles(disk, UID, live=kept[1:])
    assert [again.load(h) for h in kept] == [page_bytes(k) for k in range(3)]
    for handle in later:
        with pytest.raises(PageDamaged):
            again.load(handle)
    assert again.pinned() == frozenset(kept)
    fresh = again.store(page_bytes(99))
    assert fresh > max(kept), "a handle is never reused"
    again.drop(kept[0])
    again.retain([])  # the checkpoint is gone: only what the machine holds stays
    assert again.files() == 3
    with pytest.raises(PageDamaged):
        again.load(kept[0])


def test_garbage_from_a_crashed_machine_is_deleted_at_open() -> None:
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    for k in range(4):
        files.store(page_bytes(k))
    disk.sync_dir(pages_dir(UID))
    assert PageFiles(disk, UID).files() == 0


def test_a_torn_pin_file_pins_nothing() -> None:
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    handle = files.store(page_bytes(1))
    files.pin(3, [handle])
    files.sync(3)
    disk.flip_bit(f"{pages_dir(UID)}/{3:020d}.pin", 40)
    again = PageFiles(disk, UID)
    assert again.pinned() == frozenset() and again.files() == 0


def test_a_refused_write_is_a_storage_failure() -> None:
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    disk.fail_errno = errno.ENOSPC
    with pytest.raises(StorageFailed):
        files.store(page_bytes(1))


def test_page_files_on_a_real_disk_reload_after_reopening(tmp_path: Path) -> None:
    disk = OsDisk(str(tmp_path))
    files = PageFiles(disk, UID)
    handles = [files.store(page_bytes(k, 16_000)) for k in range(3)]
    files.pin(5, handles)
    files.sync(5)
    names = sorted(p.name for p in (tmp_path / pages_dir(UID)).iterdir())
    assert names == [*(f"{h:020d}.page" for h in handles), f"{5:020d}.pin"], "no temporary"
    again = PageFiles(OsDisk(str(tmp_path)), UID, live=handles)
    assert [again.load(h) for h in handles] == [page_bytes(k, 16_000) for k in range(3)]


def test_a_paged_machine_on_page_files_restarts_from_a_checkpoint() -> None:
    """The runtime's sequence: capture and pin, sync the pages then write the checkpoint,
    crash, reopen the page files with the pages the checkpoint names, restore, consume."""
    limits = Limits(
        page_refs=256,
        paged_index_bytes_per_queue_max=2 * 256 * 8,
        paged_index_bytes_per_node_max=8 * 256 * 8,
        page_read_ahead=1,
    )
    disk = FakeDisk()
    files = PageFiles(disk, UID)
    machine = QueueMachine(None, limits, Paging(files, NodePages.from_limits(limits)))
    plain = QueueMachine(None, limits)
    batch = encode_enqueue([NewMessage(b"m" * (k % 9)) for k in range(100)])
    for index in range(1, 51):
        for m in (machine, plain):
            m.apply(ApplyMeta(index, 1, index), batch)
    assert machine.pager is not None and machine.pager.stats().paged_out_pages >= 15
    frozen = machine.freeze()
    files.pin(50, frozen.page_handles())
    files.sync(50)
    checkpoint = frozen.encode()
    disk.crash()

    files = PageFiles(disk, UID, live=page_handles_of(checkpoint))
    restored = QueueMachine(None, limits, Paging(files, NodePages.from_limits(limits)))
    restored.restore(checkpoint)
    got: list[int] = []
    expected: list[int] = []
    for index in range(51, 111):
        for m, out in ((restored, got), (plain, expected)):
            reply, _ = m.apply(ApplyMeta(index, 1, index), encode_checkout("c", 100, 60_000))
            assert isinstance(reply, CheckedOut)
            out += reply.refs
        assert restored.pager is not None
        restored.pager.read_ahead()
    assert got == expected and len(got) == 5000
    assert restored.snapshot() == plain.snapshot()
    files.retain([])
    assert files.files() == 0


def test_a_damaged_page_file_is_rebuilt_from_the_stored_log() -> None:
    """The log entries of the messages of a damaged page are live: the machine reads
    them back through ``StoredLogReader`` and goes on as if nothing happened."""
    limits = Limits(
        page_refs=64,
        paged_index_bytes_per_queue_max=64 * 8,
        paged_index_bytes_per_node_max=64 * 8,
        page_read_ahead=0,
    )
    disk = FakeDisk()
    storage = NodeStorage.open(disk, small_limits())
    storage.open_server(UID)
    commands = [
        encode_enqueue([NewMessage(b"m" * (k % 5), priority=k % 2) for k in range(1 + i % 9)])
        for i in range(120)
    ]
    written = [Entry(i, 1, EntryKind.COMMAND, i, c) for i, c in enumerate(commands, 1)]
    storage.append(UID, written)
    storage.save_hard_state(UID, HardState(1, None, len(written)))
    storage.sync()
    storage.flush_segments()
    files = PageFiles(disk, UID)
    node = NodePages.from_limits(limits)
    machine = QueueMachine(None, limits, Paging(files, node, StoredLogReader(storage.log(UID))))
    plain = QueueMachine(None, limits)
    for m in (machine, plain):
        for e in written:
            m.apply(ApplyMeta(e.index, 1, e.now_ms), e.data)
    on_disk = sorted(disk.listdir(pages_dir(UID)))
    assert len(on_disk) >= 4
    for name in on_disk[::2]:
        disk.flip_bit(f"{pages_dir(UID)}/{name}", 8 * (HEADER_BYTES + 3))
    index = len(written)
    while plain.stats().messages_ready:
        index += 1
        checkout = encode_checkout("c", 37, 60_000)
        assert machine.apply(ApplyMeta(index, 1, index), checkout) == plain.apply(
            ApplyMeta(index, 1, index), checkout
        )
    assert machine.stats().paging.pages_rebuilt == len(on_disk[::2])
    assert machine.snapshot() == plain.snapshot()


def test_pins_drops_and_syncs_come_back_to_the_shared_empty_sets() -> None:
    """A queue that spills nothing holds no set of its own (216 bytes each); one that
    did holds none again once its checkpoints no longer name its dropped pages."""
    disk = FakeDisk()
    idle = PageFiles(disk, "idle")
    files = PageFiles(disk, UID)
    assert idle._dropped is idle._synced is files._dropped is files._synced
    a, b = files.store(page_bytes(1)), files.store(page_bytes(2))
    files.pin(7, [a, b])
    files.sync(7)
    files.drop(a)  # pinned: kept until the checkpoint goes
    assert files._dropped == {a} and files._synced == {a, b}
    assert files.load(a) == page_bytes(1)
    files.drop(b)
    files.retain([])
    assert files.files() == 0
    assert files._dropped is files._synced is idle._dropped
    c = files.store(page_bytes(3))
    files.drop(c)  # never pinned: deleted at once
    assert files.files() == 0 and files._dropped is idle._dropped


class _CountedDisk(FakeDisk):
    listed = 0

    def listdir(self, path: str) -> list[str]:
        self.listed += 1
        return super().listdir(path)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["store", "pin", "drop", "sync", "retain"]), st.integers(0, 9)),
        max_size=30,
    )
)
def test_packed_page_files_unpack_to_the_same_bookkeeping(ops: list[tuple[str, int]]) -> None:
    """A sleeping queue keeps its page files packed (``PageFiles.pack``): unpacked, they
    pin, drop, keep and collect the same pages as those packed, without a disk read."""
    disk = _CountedDisk()
    files = PageFiles(disk, UID)
    handles: list[int] = []
    tags: list[int] = []
    for op, k in ops:
        if op == "store":
            handles.append(files.store(page_bytes(k)))
        elif op == "pin" and handles:
            files.pin(k, handles[k % len(handles) :])
            tags.append(k)
        elif op == "drop" and handles:
            files.drop(handles.pop(k % len(handles)))
        elif op == "sync" and tags:
            files.sync(tags[k % len(tags)])
        elif op == "retain":
            files.retain(tags[: k % (len(tags) + 1)])
            tags = tags[: k % (len(tags) + 1)]
    packed = files.pack()
    listed = disk.listed
    again = PageFiles.unpacked(disk, UID, packed)
    assert disk.listed == listed  # nothing read to unpack them
    assert again.pack() == packed
    assert again.pinned() == files.pinned() and again.files() == files.files()
    for tag in tags:
        again.sync(tag)
    again.retain([])
    files.retain([])
    assert again.files() == files.files() == len(handles)
    assert [again.load(h) for h in handles] == [files.load(h) for h in handles]
    assert again.store(b"next") == files.store(b"next") != 0


def test_page_files_that_never_spilled_pack_as_one_shared_object() -> None:
    assert PageFiles(FakeDisk(), "a").pack() is PageFiles(FakeDisk(), "b").pack()
