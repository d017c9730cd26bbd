"""The disk interface: every byte the storage layer reads or writes goes through it.

Rule: storage code never calls ``os`` or ``open`` itself. ``OsDisk`` is the real
implementation; ``FakeDisk`` keeps files in memory for tests and the simulator and models
what a crash does to them: data written but not synced may be lost or torn, a file
created or renamed is only durable once its directory is synced. It can also flip bits
in any file and fail writes with ``ENOSPC`` or ``EIO``, so the real WAL, segment and
checkpoint code is exercised against the failures it must survive.

Paths are relative to the disk's root and use ``/``. Directories are created with
``makedirs`` and treated as durable at once (a simplification of the fake disk).

``OsDisk.remove`` renames the file into ``TRASH_DIR`` and a background thread unlinks
it: freeing the blocks of a 256 MiB WAL file or a large segment (and, on a file system
mounted with ``discard``, trimming them) took 30 to 65 ms, on the event loop where
storage runs. The rename is as atomic as the unlink, and a name in the trash is never
reused, so nothing else changes: the caller still syncs the parent directory to make
the removal durable, and files a crash left in the trash are unlinked at the next open.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import queue
import random
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

_IOV_MAX = 1024
"""The most buffers one ``pwritev`` takes (Linux's ``IOV_MAX``)."""


class DiskFile(Protocol):
    """An open file. Writes go at the end (``append``) or at an offset (``pwrite``)."""

    def append(self, data: bytes) -> None: ...

    def append_parts(self, parts: list[bytes]) -> None:
        """``append`` of the bytes of ``parts`` in order, without joining them first."""
        ...

    def pwrite(self, offset: int, data: bytes) -> None: ...

    def pread(self, offset: int, length: int) -> bytes: ...

    def pread_into(self, offset: int, into: memoryview) -> int:
        """Read up to ``len(into)`` bytes at ``offset`` into ``into``; how many were
        read (fewer only at the end of the file)."""
        ...

    def size(self) -> int: ...

    def sync(self) -> None:
        """``fdatasync``: the file's data written so far survives a crash."""
        ...

    def truncate(self, length: int) -> None: ...

    def uncache(self, offset: int) -> None:
        """Drop the file's synced pages wholly past ``offset`` from the page cache (a
        hint: later reads of them go to the disk)."""
        ...

    def close(self) -> None: ...


class Disk(Protocol):
    concurrent: bool
    """Whether distinct files may be written from several threads at once."""

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        """Open for reading and writing; ``create`` makes an empty file if none exists."""
        ...

    def read(self, path: str) -> bytes: ...

    def read_mapped(self, path: str) -> memoryview:
        """The whole file as a read-only buffer, without copying where the disk can map
        it (a large checkpoint loads in the time it takes to map and check it)."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomic replace of ``dst``; durable once the directory is synced."""
        ...

    def sync_dir(self, path: str) -> None: ...

    def sync_all(self) -> None:
        """Everything written so far, every file's data and every directory entry, on
        the whole disk, survives a crash: one sync for a batch of many files instead of
        an fsync of each file and of each directory (``write_files_atomic``)."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in the directory, sorted; empty if it does not exist."""
        ...

    def remove(self, path: str) -> None: ...

    def makedirs(self, path: str) -> None: ...

    def remove_dir(self, path: str) -> None:
        """Remove an empty directory; nothing if it does not exist."""
        ...

    def exists(self, path: str) -> bool: ...


def parent(path: str) -> str:
    return path.rpartition("/")[0]


def ensure_dir(disk: Disk, path: str) -> None:
    """Make directory ``path`` if it is missing, its entry durable (the parent synced)
    before anything is written into it. A server's checkpoint, snapshot and page
    directories are made so, with their first file, not when it opens: a start of a
    node of 10,000 queues would otherwise try to make 30,000 directories."""
    if not disk.exists(path):
        disk.makedirs(path)
        disk.sync_dir(parent(path))


def write_file_atomic(
    disk: Disk, path: str, data: bytes, tail: Sequence[bytes] = (), *, cached: bool = True
) -> None:
    """Temporary name, write, fsync, rename, directory fsync: all of ``data`` then the
    buffers of ``tail`` (written as they are, with one ``append_parts``) or nothing.
    Not ``cached``: once synced, what ``tail`` wrote leaves the page cache, but for the
    page ``data`` ends in (``data``, written on its own, stays)."""
    tmp = path + ".tmp"
    f = disk.open(tmp, create=True)
    try:
        f.truncate(0)
        f.append(data)
        if tail:
            f.append_parts(list(tail))
        f.sync()
        if not cached:
            f.uncache(len(data))
    finally:
        f.close()
    disk.rename(tmp, path)
    disk.sync_dir(parent(path))


def write_files_atomic(disk: Disk, files: list[tuple[str, bytes]], written: list[str]) -> None:
    """``write_file_atomic`` of many files at once, each all or nothing, with two syncs
    of the whole disk instead of two fsyncs per file: every file under its temporary
    name, a sync (their data is durable), the renames, a sync (the names are). A crash
    in between leaves some files under their final name, each whole, and temporary
    files, which recovery removes, as after a crash in ``write_file_atomic``. Their
    directories are made here, durable with the second sync. Each path written to is
    added to ``written`` as it is, so that a caller may remove them after an error."""
    for path, data in files:
        disk.makedirs(parent(path))
        tmp = path + ".tmp"
        written.append(tmp)
        f = disk.open(tmp, create=True)
        try:
            f.truncate(0)
            f.append(data)
        finally:
            f.close()
    disk.sync_all()
    for path, _ in files:
        written.append(path)
        disk.rename(path + ".tmp", path)
    disk.sync_all()


# --- the real disk --------------------------------------------------------------------


_READ_CHUNK = 1 << 16
"""What ``OsDisk.read`` asks of each read: a small file's whole content (below the size
from which malloc maps a buffer of its own)."""


class _OsFile:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def append(self, data: bytes) -> None:
        self.pwrite(self._size, data)

    def append_parts(self, parts: list[bytes]) -> None:
        offset = self._size
        for at in range(0, len(parts), _IOV_MAX):
            group = parts[at : at + _IOV_MAX]
            want = sum(map(len, group))
            n = os.pwritev(self._fd, group, offset)
            if n < want:  # a short write (rare on a file): the rest one buffer at a time
                self.pwrite(offset + n, memoryview(b"".join(group))[n:])
            offset += want
        self._size = max(self._size, offset)

    def pwrite(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, offset)
            offset += n
            view = view[n:]
        self._size = max(self._size, offset)

    def pread(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def pread_into(self, offset: int, into: memoryview) -> int:
        done = 0
        while done < len(into):
            n = os.preadv(self._fd, [into[done:]], offset + done)
            if n == 0:  # the end of the file
                break
            done += n
        return done

    def size(self) -> int:
        return self._size

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def truncate(self, length: int) -> None:
        os.ftruncate(self._fd, length)
        self._size = length

    def uncache(self, offset: int) -> None:
        os.posix_fadvise(self._fd, offset, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


TRASH_DIR = ".trash"
"""Under an ``OsDisk``'s root: removed files waiting to be unlinked (module docstring)."""

log = logging.getLogger(__name__)


class _Reaper:
    """Unlinks the files handed to it, one at a time, on a daemon thread (one for the
    process, started by the first removal). Files it has not reached when the process
    ends stay in the trash until the next open."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="quorra-reaper", daemon=True)
        self._thread.start()

    def put(self, path: str) -> None:
        self._queue.put(path)

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            try:
                with contextlib.suppress(FileNotFoundError):  # emptied by another open
                    os.remove(path)
            except OSError as exc:  # stays in the trash; the next open tries again
                log.warning("could not unlink %s: %s", path, exc)


_reaper: _Reaper | None = None
_reaper_lock = threading.Lock()


def _reap(path: str) -> None:
    global _reaper
    with _reaper_lock:
        if _reaper is None:
            _reaper = _Reaper()
    _reaper.put(path)


_SYNCFS = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
"""``syncfs(2)`` of the C library; Python has no binding of its own."""


def _syncfs(fd: int) -> None:
    """Sync the file system of ``fd``. Linux reports a writeback error of any of its
    files since 5.8; without ``syncfs`` (not Linux), ``sync`` of every file system."""
    if _SYNCFS is None:
        os.sync()
        return
    if _SYNCFS(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class OsDisk:
    """Files under ``root`` on the real file system."""

    concurrent = True

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._trash = os.path.join(self.root, TRASH_DIR)
        os.makedirs(self._trash, exist_ok=True)
        for name in os.listdir(self._trash):  # left by a crash
            _reap(os.path.join(self._trash, name))

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path)

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        return _OsFile(os.open(self._p(path), flags, 0o644))

    def read(self, path: str) -> bytes:
        # Reads to the end without ``open()``'s file object, whose fstat, isatty ioctl and
        # buffer a start paid for each of its 10,000 queues' definitions.
        fd = os.open(self._p(path), os.O_RDONLY)
        try:
            parts = []
            while chunk := os.read(fd, _READ_CHUNK):
                parts.append(chunk)
        finally:
            os.close(fd)
        return b"".join(parts)

    def read_mapped(self, path: str) -> memoryview:
        fd = os.open(self._p(path), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return memoryview(b"")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            return memoryview(mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ))
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(self._p(src), self._p(dst))

    def sync_dir(self, path: str) -> None:
        fd = os.open(self._p(path) if path else self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_all(self) -> None:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _syncfs(fd)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._p(path)))
        except FileNotFoundError:
            return []

    def remove(self, path: str) -> None:
        """Gone from ``path`` at once (a rename into the trash); unlinked in the background."""
        trashed = os.path.join(self._trash, f"{uuid.uuid4().hex}-{os.path.basename(path)}")
        os.rename(self._p(path), trashed)
        _reap(trashed)

    def makedirs(self, path: str) -> None:
        os.makedirs(self._p(path), exist_ok=True)

    def remove_dir(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(self._p(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))


# --- the fake disk --------------------------------------------------------------------


@dataclass(eq=False)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""


class _FakeFile:
    def __init__(self, disk: FakeDisk, inode: _Inode) -> None:
        self._disk = disk
        self._inode = inode
        self._epoch = disk.epoch

    def _check(self) -> _Inode:
        assert self._epoch == self._disk.epoch, "file handle used after a crash"
        return self._inode

    def append(self, data: bytes) -> None:
        self.pwrite(len(self._check().data), data)

    def append_parts(self, parts: list[bytes]) -> None:
        self.append(b"".join(parts))

    def pwrite(self, offset: int, data: bytes) -> None:
        inode = self._check()
        self._disk.before_write(max(0, offset + len(data) - len(inode.data)))
        if offset > len(inode.data):
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset : offset + len(data)] = data

    def pread(self, offset: int, length: int) -> bytes:
        return bytes(self._check().data[offset : offset + length])

    def pread_into(self, offset: int, into: memoryview) -> int:
        data = self._check().data[offset : offset + len(into)]
        into[: len(data)] = data
        return len(data)

    def size(self) -> int:
        return len(self._check().data)

    def sync(self) -> None:
        inode = self._check()
        self._disk.before_write(0)
        self._disk.syncs += 1
        inode.synced = bytes(inode.data)

    def truncate(self, length: int) -> None:
        inode = self._check()
        self._disk.before_write(0)
        del inode.data[length:]

    def uncache(self, offset: int) -> None:
        pass

    def close(self) -> None:
        pass


class FakeDisk:
    """An in-memory disk that can crash, tear, corrupt and fail (see module docstring).

    ``crash(rng)`` models a power loss: each file keeps its synced data plus, if the
    unsynced part only extends the file, a random prefix of it (a torn write); directory
    entries not synced are undone. ``fail_errno`` makes every write fail with that errno
    until cleared; ``space_bytes`` makes writes past that many bytes in total fail with
    ``ENOSPC`` and write nothing. It is written from one thread at a time
    (``concurrent``), so that a simulation with a seed is one run.
    """

    concurrent = False

    def __init__(self) -> None:
        self._dirs: dict[str, dict[str, _Inode]] = {"": {}}
        self._synced_dirs: dict[str, dict[str, _Inode]] = {"": {}}
        self.epoch = 0
        self.syncs = 0
        self.fail_errno: int | None = None
        self.space_bytes: int | None = None

    # -- faults -------------------------------------------------------------------------

    def before_write(self, growth_bytes: int) -> None:
        if self.fail_errno is not None:
            raise OSError(self.fail_errno, os.strerror(self.fail_errno))
        if self.space_bytes is not None and self.used_bytes() + growth_bytes > self.space_bytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def used_bytes(self) -> int:
        return sum(len(i.data) for d in self._dirs.values() for i in d.values())

    def flip_bit(self, path: str, bit: int) -> None:
        """Corrupt one bit of a file, synced or not (as bad media would)."""
        inode = self._inode(path)
        byte, mask = bit // 8, 1 << (bit % 8)
        inode.data[byte] ^= mask
        if byte < len(inode.synced):
            synced = bytearray(inode.synced)
            synced[byte] ^= mask
            inode.synced = bytes(synced)

    def crash(self, rng: random.Random | None = None) -> None:
        """Power loss. With ``rng``, unsynced appends may survive in part (torn)."""
        self.epoch += 1
        self._dirs = {d: dict(entries) for d, entries in self._synced_dirs.items()}
        for entries in self._dirs.values():
            for inode in entries.values():
                extra = bytes(inode.data[len(inode.synced) :])
                keep = b""
                if rng is not None and extra and inode.data.startswith(inode.synced):
                    keep = extra[: rng.randrange(len(extra) + 1)]
                inode.data = bytearray(inode.synced + keep)

    # -- the Disk protocol ----------------------------------------------------------------

    def _split(self, path: str) -> tuple[dict[str, _Inode], str]:
        d, _, name = path.rpartition("/")
        if d not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", d)
        return self._dirs[d], name

    def _inode(self, path: str) -> _Inode:
        entries, name = self._split(path)
        if name not in entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return entries[name]

    def open(self, path: str, *, create: bool = False) -> DiskFile:
        entries, name = self._split(path)
        if name not in entries:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self.before_write(0)
            entries[name] = _Inode()
        return _FakeFile(self, entries[name])

    def read(self, path: str) -> bytes:
        return bytes(self._inode(path).data)

    def read_mapped(self, path: str) -> memoryview:
        return memoryview(self.read(path))

    def rename(self, src: str, dst: str) -> None:
        self.before_write(0)
        inode = self._inode(src)
        src_entries, src_name = self._split(src)
        dst_entries, dst_name = self._split(dst)
        del src_entries[src_name]
        dst_entries[dst_name] = inode

    def sync_dir(self, path: str) -> None:
        self.before_write(0)
        self.syncs += 1
        self._synced_dirs[path] = dict(self._dirs[path])

    def sync_all(self) -> None:
        self.before_write(0)
        self.syncs += 1
        for entries in self._dirs.values():
            for inode in entries.values():
                inode.synced = bytes(inode.data)
        self._synced_dirs = {d: dict(entries) for d, entries in self._dirs.items()}

    def listdir(self, path: str) -> list[str]:
        prefix = path + "/" if path else ""
        names = set(self._dirs.get(path, {}))
        names.update(
            d[len(prefix) :].split("/")[0] for d in self._dirs if d.startswith(prefix) and d
        )
        names.discard("")
        return sorted(names)

    def remove(self, path: str) -> None:
        entries, name = self._split(path)
        if name not in entries:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        del entries[name]

    def makedirs(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            self._dirs.setdefault(d, {})
            self._synced_dirs.setdefault(d, {})

    def remove_dir(self, path: str) -> None:
        if path not in self._dirs:
            return
        assert not self.listdir(path), f"directory {path} is not empty"
        del self._dirs[path]
        self._synced_dirs.pop(path, None)

    def exists(self, path: str) -> bool:
        if path in self._dirs:
            return True
        d, _, name = path.rpartition("/")
        return name in self._dirs.get(d, {})


__all__ = [
    "Disk",
    "DiskFile",
    "FakeDisk",
    "OsDisk",
    "ensure_dir",
    "parent",
    "write_file_atomic",
    "write_files_atomic",
]
