"""Page files of one queue: the pages of its ready index that are out of memory
(``engine.queue.paging``), a ``PageSpill`` on a ``Disk``.

Rule: one immutable file per page, ``queues/<uid>/pages/<handle:020>.page``, checked by
CRC32C whenever it is read; a page file is deleted only once the machine has dropped it
and no checkpoint names it.

File format: a 24-byte header (magic ``QPAG``, version u16, flags u16, handle u64, data
length u32, CRC32C u32 of the header's first 20 bytes and the data), then the data (the
page as ``engine.queue.pages.encode_page`` stores it). A file that is short, torn,
rotten, or names another handle fails the check: ``load`` raises ``PageDamaged``, as it
does for a missing file, and the machine rebuilds the page from the log.

Why a file per page, written without fsync or rename, and made durable later:

* A page is written once and never changed, and pages die out of order (several lanes,
  checkpoints keeping some). A file per page makes dropping a page an unlink; pages
  appended to shared files would need a compaction of their own to reclaim the space.
* The live machine needs nothing durable from its page store: after a crash it is
  restored from a checkpoint and the log, never from pages written since. So ``store``
  writes the file and nothing more (no reader sees a handle before ``store`` returns it,
  so there is no half-written page to hide behind a rename), and what a crash tears is
  garbage, deleted at the next open. Durability is paid once per page, and only for
  pages a checkpoint names: ``sync(tag)`` fsyncs them and the directory, then writes the
  checkpoint's pin file atomically (temporary name, fsync, rename, directory fsync),
  before the checkpoint itself is written (the durability order: pages, pins,
  checkpoint). A temp + fsync + rename per page would cost two fsyncs per 4096
  messages spilled, most of them for pages consumed before any checkpoint names them.

Checkpoints: ``pin(tag, handles)`` on the loop when a checkpoint is captured (its pages
then outlive their ``drop``), ``sync(tag)`` in the checkpoint's worker before it is
written, ``retain(tags)`` with the checkpoints still on disk (after each write, promotion
or installed snapshot), ``unpin(tag)`` if the write failed. Pin files,
``<tag:020>.pin``: magic ``QPIN``, count u32, the handles as u64, CRC32C u32 of all that.
At open, every page no pin file names and the restored machine does not hold is deleted.

Threads: ``store``, ``drop``, ``pin``, ``retain`` on the loop; ``load`` (read-ahead) and
``sync`` (checkpoints) may run in workers; a lock guards the bookkeeping.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Iterable
from typing import cast

import crc32c
import msgpack

from engine.errors import PageDamaged, StorageFailed
from engine.raft.entry import EntryKind
from engine.shared_empty import EMPTY_DICT, shared
from engine.storage.disk import Disk, ensure_dir, write_file_atomic
from engine.storage.reaper import server_root
from engine.storage.server_log import ServerLog

log = logging.getLogger("quorra.engine")

_MAGIC = b"QPAG"
_VERSION = 1
_HEADER = struct.Struct("<4sHHQI")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CRC.size
_PIN_MAGIC = b"QPIN"
_PIN_HEAD = struct.Struct("<4sI")
_PAGE_SUFFIX = ".page"
_PIN_SUFFIX = ".pin"


_NO_HANDLES: frozenset[int] = frozenset()
"""What ``_dropped`` and ``_synced`` hold while empty, shared: every queue has both, most
never spill a page, and an empty set costs 216 bytes."""


_LOCK = threading.Lock()
"""Guards every queue's handles, pins and page sets (the loop and workers both change
them). One for all: it is held for a few set operations and never over I/O, so sharing
it costs no waiting worth counting, and each of thousands of queues its own lock."""


def _shared_if_empty(handles: frozenset[int]) -> frozenset[int]:
    return handles if handles else _NO_HANDLES


def pages_dir(uid: str) -> str:
    return f"{server_root(uid)}/pages"


class PageFiles:
    """The page files of queue ``uid`` (see the module's rule). ``live``: the handles the
    machine restored from its checkpoint holds."""

    # Slots: one per queue, thousands on a node (no instance dict each).
    __slots__ = (
        "_dir_made",
        "_disk",
        "_dropped",
        "_next_handle",
        "_pins",
        "_synced",
        "uid",
    )

    def __init__(self, disk: Disk, uid: str, live: Iterable[int] = ()) -> None:
        self._disk = disk
        self.uid = uid
        names = disk.listdir(self.dir)  # made with its first file: missing lists empty
        self._dir_made = bool(names)
        pins: dict[int, frozenset[int]] = {}
        for name in names:
            if name.endswith(_PIN_SUFFIX):
                pinned = self._read_pins(name)
                if pinned is None:  # torn: its checkpoint was never written
                    disk.remove(f"{self.dir}/{name}")
                else:
                    pins[int(name[: -len(_PIN_SUFFIX)])] = pinned
            elif not name.endswith(_PAGE_SUFFIX):
                disk.remove(f"{self.dir}/{name}")  # a pin file's temporary name
        self._pins = pins or EMPTY_DICT
        """By checkpoint tag, the handles it names; the shared empty dict while none
        (most queues never spill a page), a dict of its own from the first ``pin``."""
        on_disk = {int(n[: -len(_PAGE_SUFFIX)]) for n in names if n.endswith(_PAGE_SUFFIX)}
        self._next_handle = max(on_disk, default=0) + 1
        live = set(live)
        keep = self._pinned() | live
        for handle in sorted(on_disk - keep):
            self._unlink(handle)
        self._dropped = _shared_if_empty(frozenset((on_disk & keep) - live))
        """Pages the machine no longer holds that a checkpoint still names (frozen, made
        again at each change: pages are dropped and synced a few at a time)."""
        self._synced = _shared_if_empty(frozenset(on_disk & self._pinned()))
        """Pages fsynced (those a pin file names were synced before it was written)."""

    # --- the PageSpill protocol -----------------------------------------------------------

    @property
    def dir(self) -> str:
        """The queue's page directory (made again from the uid at each use: page files
        are few and slow next to it, queues many)."""
        return pages_dir(self.uid)

    def store(self, data: bytes) -> int:
        with _LOCK:
            handle = self._next_handle
            self._next_handle += 1
        head = _HEADER.pack(_MAGIC, _VERSION, 0, handle, len(data))
        crc = crc32c.crc32c(data, crc32c.crc32c(head))
        try:
            self._make_dir()
            f = self._disk.open(self._path(handle), create=True)
            try:
                f.append(b"".join([head, _CRC.pack(crc), data]))
            finally:
                f.close()
        except OSError as e:
            raise StorageFailed(f"page file {handle} not written: {e}") from e
        return handle

    def load(self, handle: int) -> bytes:
        try:
            raw = self._disk.read(self._path(handle))
        except OSError as e:
            raise PageDamaged(f"page file {handle} unreadable: {e}", handle=handle) from e
        if len(raw) >= HEADER_BYTES:
            magic, version, _flags, named, length = _HEADER.unpack_from(raw)
            (crc,) = _CRC.unpack_from(raw, _HEADER.size)
            data = raw[HEADER_BYTES:]
            if (
                magic == _MAGIC
                and version == _VERSION
                and named == handle
                and length == len(data)
                and crc == crc32c.crc32c(data, crc32c.crc32c(raw[: _HEADER.size]))
            ):
                return data
        raise PageDamaged(f"page file {handle} fails its check", handle=handle)

    def drop(self, handle: int) -> None:
        with _LOCK:
            if handle in self._pinned():
                self._dropped = self._dropped | {handle}
                return
            if handle in self._synced:
                self._synced = _shared_if_empty(self._synced - {handle})
        self._unlink(handle)

    # --- checkpoints ----------------------------------------------------------------------

    def pin(self, tag: int, handles: Iterable[int]) -> None:
        """Checkpoint ``tag`` names ``handles``: they stay until it is unpinned. A tag
        pinned again keeps its earlier handles too: two captures at the same index may
        name different pages, and the file written last is not known until both are."""
        with _LOCK:
            if self._pins is EMPTY_DICT:
                self._pins = {}
            self._pins[tag] = self._pins.get(tag, frozenset()) | frozenset(handles)

    def sync(self, tag: int) -> None:
        """Make checkpoint ``tag``'s pages durable, then its pin file: before the
        checkpoint is written (may run in a worker)."""
        with _LOCK:
            handles = self._pins[tag]
            todo = sorted(handles - self._synced)
        self._make_dir()
        for handle in todo:
            f = self._disk.open(self._path(handle))
            try:
                f.sync()
            finally:
                f.close()
        if todo:
            self._disk.sync_dir(self.dir)
        body = _PIN_HEAD.pack(_PIN_MAGIC, len(handles)) + b"".join(
            struct.pack("<Q", h) for h in sorted(handles)
        )
        write_file_atomic(self._disk, self._pin_path(tag), body + _CRC.pack(crc32c.crc32c(body)))
        if todo:
            with _LOCK:
                self._synced = self._synced | frozenset(todo)

    def unpin(self, tag: int) -> None:
        self.retain(t for t in list(self._pins) if t != tag)

    def retain(self, tags: Iterable[int]) -> None:
        """Only the checkpoints ``tags`` still exist: the pins of the others go, and the
        pages only they kept are deleted."""
        keep = set(tags)
        with _LOCK:
            gone = sorted(set(self._pins) - keep)
            for tag in gone:
                del self._pins[tag]
            if not self._pins:
                self._pins = EMPTY_DICT
            pinned = self._pinned()
            free = sorted(self._dropped - pinned)
            if free:
                self._dropped = _shared_if_empty(self._dropped - set(free))
                self._synced = _shared_if_empty(self._synced - set(free))
        for tag in gone:
            if self._disk.exists(self._pin_path(tag)):
                self._disk.remove(self._pin_path(tag))
        for handle in free:
            self._unlink(handle)

    def pinned(self) -> frozenset[int]:
        with _LOCK:
            return self._pinned()

    def pack(self) -> bytes:
        """Its bookkeeping as one msgpack array, what a sleeping queue keeps of it
        (``unpacked`` gives it back without listing the directory). Equal ones are one
        object: a queue that never spilled a page packs as every other such queue."""
        with _LOCK:
            pins = [[tag, sorted(handles)] for tag, handles in sorted(self._pins.items())]
            dropped, synced = sorted(self._dropped), sorted(self._synced)
            fields = (self._dir_made, self._next_handle, pins, dropped, synced)
        return shared(cast(bytes, msgpack.packb(fields)))

    @classmethod
    def unpacked(cls, disk: Disk, uid: str, packed: bytes) -> PageFiles:
        """The page files ``pack`` gave ``packed`` of, as they were (nothing is read: the
        files on disk are those they knew of, as nothing wrote any since)."""
        files = cls.__new__(cls)
        dir_made, next_handle, pins, dropped, synced = msgpack.unpackb(packed)
        files._disk = disk
        files.uid = uid
        files._dir_made = dir_made
        files._next_handle = next_handle
        files._pins = {tag: frozenset(handles) for tag, handles in pins} or EMPTY_DICT
        files._dropped = _shared_if_empty(frozenset(dropped))
        files._synced = _shared_if_empty(frozenset(synced))
        return files

    def files(self) -> int:
        """Page files on disk (those of the live machine and those checkpoints keep)."""
        return sum(1 for n in self._disk.listdir(self.dir) if n.endswith(_PAGE_SUFFIX))

    # --- helpers --------------------------------------------------------------------------

    def _make_dir(self) -> None:
        """The directory, made (and its entry synced) before the first file is written
        into it. Idempotent: the loop and a worker may both get here first."""
        if not self._dir_made:
            ensure_dir(self._disk, self.dir)
            self._dir_made = True

    def _pinned(self) -> frozenset[int]:
        return frozenset().union(*self._pins.values())

    def _path(self, handle: int) -> str:
        return f"{self.dir}/{handle:020d}{_PAGE_SUFFIX}"

    def _pin_path(self, tag: int) -> str:
        return f"{self.dir}/{tag:020d}{_PIN_SUFFIX}"

    def _unlink(self, handle: int) -> None:
        """Delete a page file. Not synced: a file a crash brings back is deleted at open."""
        try:
            self._disk.remove(self._path(handle))
        except FileNotFoundError:
            pass
        except OSError as e:  # stays as garbage until the next open
            log.warning("page file %s not deleted: %s", handle, e)

    def _read_pins(self, name: str) -> frozenset[int] | None:
        raw = self._disk.read(f"{self.dir}/{name}")
        if len(raw) < _PIN_HEAD.size + _CRC.size:
            return None
        magic, count = _PIN_HEAD.unpack_from(raw)
        end = _PIN_HEAD.size + 8 * count
        if magic != _PIN_MAGIC or len(raw) != end + _CRC.size:
            return None
        if crc32c.crc32c(raw[:end]) != _CRC.unpack_from(raw, end)[0]:
            return None
        return frozenset(h for (h,) in struct.iter_unpack("<Q", raw[_PIN_HEAD.size : end]))


class StoredLogReader:
    """``Paging.read_log`` over a server's stored log, to rebuild a damaged page: the
    command entries at the indexes asked that are still stored and sound (one that is
    not is left out, and the rebuild then fails its check). On the node's loop.

    A slotted object rather than a closure: one per queue, and a closure with its cell
    costs an idle queue 200 bytes, this 48."""

    __slots__ = ("log",)

    def __init__(self, log: ServerLog) -> None:
        self.log = log

    def __call__(self, indexes: list[int]) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        for index in indexes:
            try:
                entry = self.log.read(index)
            except (LookupError, StorageFailed):
                continue
            if entry.kind is EntryKind.COMMAND:
                out.append((index, entry.data))
        return out


__all__ = ["HEADER_BYTES", "PageFiles", "StoredLogReader", "pages_dir"]
