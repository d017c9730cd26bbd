"""The reaper: deleting the files of one node's storage that are no longer needed.

Rule: a file leaves a server's view first and is deleted after. A segment that left the
view (``retire``) is deleted at once unless a reader or a compaction has it pinned, then
when its last pin is released (``unpin``); a phase-3 intent file is deleted once every
input segment it names is gone, since until then a crash must be able to finish or undo
the rewrite it records. Every deletion evicts the path from the reader cache first and
syncs the directory after. Pins are counted in ``SegmentPins``; a ``PinnedReader`` holds
its pins until ``release``. Used on the storage's owner thread only, but for
``PinnedReader.read`` (its files are its own).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.raft.entry import Entry
from engine.storage.disk import Disk, parent
from engine.storage.repair import repair_path
from engine.storage.segment import ReaderCache, SegmentInfo, SegmentReader, segment_dir

QUEUES_DIR = "queues"


def server_root(uid: str) -> str:
    return f"{QUEUES_DIR}/{uid}"


def server_dirs(uid: str) -> tuple[str, ...]:
    """The directories of a server's segments, checkpoints, snapshot and page files
    (``engine.storage.page_files``)."""
    root = server_root(uid)
    return segment_dir(uid), f"{root}/checkpoints", f"{root}/snapshots", f"{root}/pages"


class SegmentPins:
    """Reference counts of segment files in use by readers and compaction jobs."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def pin(self, path: str) -> None:
        self._counts[path] = self._counts.get(path, 0) + 1

    def unpin(self, path: str) -> bool:
        """Drop one pin; says whether the file is now free."""
        n = self._counts[path] - 1
        assert n >= 0
        if n:
            self._counts[path] = n
            return False
        del self._counts[path]
        return True

    def pinned(self, path: str) -> bool:
        return path in self._counts

    def count(self) -> int:
        return sum(self._counts.values())


class PinnedReader:
    """Reads from a fixed set of segments that stay on disk until ``release``, whatever
    compaction or the segment writer do meanwhile. Its files are its own (not the
    node's reader cache), so it may read from a worker thread; ``release`` on the
    node's thread."""

    def __init__(
        self,
        disk: Disk,
        segments: list[tuple[SegmentInfo, int]],
        on_release: Callable[[list[str]], None],
    ) -> None:
        self.segments = segments
        self._disk = disk
        self._readers: dict[str, SegmentReader] = {}
        self._on_release: Callable[[list[str]], None] | None = on_release

    def read(self, index: int) -> Entry:
        """The entry at ``index`` from the pinned segments; ``LookupError`` if absent."""
        assert self._on_release is not None, "read after release"
        for info, hi in self.segments:
            if info.lo <= index <= hi:
                reader = self._readers.get(info.path)
                if reader is None:
                    reader = self._readers[info.path] = SegmentReader(self._disk, info)
                found = reader.read(index)
                if found is not None:
                    return found
        raise LookupError(f"entry {index} is not in the pinned segments")

    def release(self) -> None:
        if self._on_release is None:
            return
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        release, self._on_release = self._on_release, None
        release([info.path for info, _ in self.segments])

    def __enter__(self) -> PinnedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Reaper:
    """Deletes files now or when their last pin is released."""

    def __init__(self, disk: Disk, cache: ReaderCache) -> None:
        self.disk = disk
        self.cache = cache
        self.pins = SegmentPins()
        self._retired: set[str] = set()
        """Segment files out of every view, kept until their last pin is released."""
        self._intents: dict[str, set[str]] = {}
        """Phase-3 intent files and the inputs still on disk they wait for."""

    @property
    def deferred_files(self) -> int:
        """Segment files out of every view still waiting for a pin's release."""
        return len(self._retired)

    def remove(self, path: str) -> None:
        self.cache.evict(path)
        if self.disk.exists(path):
            self.disk.remove(path)
            self.disk.sync_dir(parent(path))

    def retire(self, path: str) -> None:
        """A segment left the view: delete it now, or when its last pin is released."""
        self.cache.evict(path)
        if self.pins.pinned(path):
            self._retired.add(path)
            return
        self.remove(path)
        self._settle_intents(path)

    def wait_for(self, intent: str, inputs: set[str]) -> None:
        """Delete the intent file ``intent`` once every path of ``inputs`` is gone."""
        self._intents[intent] = inputs

    def _settle_intents(self, path: str) -> None:
        """Delete the phase-3 intents that waited only for ``path`` to be gone."""
        for intent, waiting in list(self._intents.items()):
            waiting.discard(path)
            if not waiting:
                del self._intents[intent]
                self.remove(intent)

    def unpin(self, paths: list[str]) -> None:
        for path in paths:
            if self.pins.unpin(path) and path in self._retired:
                self._retired.discard(path)
                self.remove(path)
                self._settle_intents(path)

    def empty_dirs(self, uid: str) -> None:
        """Delete every segment, checkpoint, snapshot and page file of ``uid``."""
        for directory in server_dirs(uid):
            for name in self.disk.listdir(directory):
                self.remove(f"{directory}/{name}")

    def delete_server(self, uid: str) -> None:
        """Delete every file of ``uid``, its repair marker and its directories."""
        self.remove(repair_path(uid))
        for directory in server_dirs(uid):
            for name in self.disk.listdir(directory):
                self.remove(f"{directory}/{name}")
            self.disk.remove_dir(directory)
        self.disk.remove_dir(server_root(uid))
        self.disk.sync_dir(QUEUES_DIR)


__all__ = [
    "QUEUES_DIR",
    "PinnedReader",
    "Reaper",
    "SegmentPins",
    "server_dirs",
    "server_root",
]
