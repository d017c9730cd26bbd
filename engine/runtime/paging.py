"""Paging on a node: every queue machine's page files, the node's page budget, and the
read-ahead of each queue run as a job.

Rule: the machines page their ready index themselves (``engine.queue.paging``); this
part gives each one its ``Paging`` (a ``PageFiles`` in its queue directory, the node's
one ``NodePages``, a reader of its stored log to rebuild a damaged page) and runs what
the machine cannot: read-ahead is planned on the loop, its pages are read by a worker
(which touches the page files and nothing else) and installed on the loop, the way a
segment flush is. Checkpoints pin the pages they name from their capture until no
checkpoint file names them (``pin_capture``, ``retain``); the tags of captures not yet
written are kept here, so that a write or a compaction finishing meanwhile does not
unpin them. Everything here runs on the node's loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.queue.machine import FrozenMachine
from engine.queue.paging import NodePages, PageLoad, Paging, QueuePager, load_plan
from engine.queue.snapshots import inline_snapshot
from engine.runtime.replica import Replica
from engine.shared_empty import shared
from engine.storage import ServerLog
from engine.storage.page_files import PageFiles, StoredLogReader

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Pages:
    """The page files of the node's queues and the budget they share."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.node = NodePages.from_limits(ctx.limits)
        self.files: dict[str, PageFiles | bytes] = {}
        """By queue uid; a sleeping queue's packed (``pack``, ``PageFiles.pack``)."""
        self._capturing: dict[str, Counter[int]] = {}
        """Tags (checkpoint indexes) pinned by a capture whose file is not written yet."""

    def paging(self, uid: str, server_log: ServerLog, live: Sequence[int]) -> Paging:
        """The ``Paging`` of the machine of ``uid``, restored from a checkpoint that names
        the stored pages ``live`` (``page_handles``: its list of stored pages, not the
        pages); its page files keep them."""
        files = PageFiles(self.ctx.storage.disk, uid, live)
        self.files[uid] = files
        return Paging(files, self.node, StoredLogReader(server_log))

    def paging_again(self, uid: str, server_log: ServerLog) -> Paging:
        """The ``Paging`` of a machine woken up (``engine.runtime.hibernation``): its
        page files stayed open here while it slept."""
        files = self.opened(uid)
        assert files is not None, f"{uid}: hosted first"
        return Paging(files, self.node, StoredLogReader(server_log))

    def pack(self, uid: str) -> None:
        """Keep the page files of ``uid`` packed: its queue fell asleep."""
        files = self.files.get(uid)
        if isinstance(files, PageFiles):
            self.files[uid] = files.pack()

    def packed(self, uid: str) -> bytes:
        """The page files of ``uid`` packed, as they stay (a clean stop saves them for a
        sleeping queue, ``engine.runtime.sleepers``)."""
        files = self.files[uid]
        return files if isinstance(files, bytes) else files.pack()

    def restore_packed(self, uid: str, packed: bytes) -> None:
        """At start, the page files of a queue that comes back asleep, as the last clean
        stop saved them (``packed``): its page directory is not listed."""
        self.files[uid] = shared(packed)

    def opened(self, uid: str) -> PageFiles | None:
        """The page files of ``uid``, unpacked (for good) if they were packed."""
        files = self.files.get(uid)
        if isinstance(files, bytes):
            files = self.files[uid] = PageFiles.unpacked(self.ctx.storage.disk, uid, files)
        return files

    def forget(self, uid: str) -> None:
        """The queue left this node (its directory goes with it)."""
        self.files.pop(uid, None)
        self._capturing.pop(uid, None)

    # --- read-ahead -----------------------------------------------------------------------

    def maybe_read_ahead(self, rep: Replica) -> bool:
        """Start the read-ahead of ``rep``'s machine if its head moved onto new pages and
        none runs; whether one started."""
        pager = rep.machine.pager
        if pager is None or not pager.wants_read_ahead or rep.reading_ahead or rep.closed:
            return False
        if not self.ctx.running:
            return False
        plan = pager.plan_read_ahead()
        if not plan:
            return False
        rep.reading_ahead = True
        self.ctx.spawn(self._read_ahead(rep, pager, plan))
        return True

    async def _read_ahead(self, rep: Replica, pager: QueuePager, loads: list[PageLoad]) -> None:
        ctx = self.ctx
        try:
            async with ctx.job():
                loaded = await ctx.in_worker(load_plan, pager.spill, loads)
            # A machine restored meanwhile (a snapshot installed) has another pager.
            if not rep.closed and rep.machine.pager is pager:
                pager.finish_read_ahead(loads, loaded)
        finally:
            rep.reading_ahead = False
        self.maybe_read_ahead(rep)

    # --- checkpoints ----------------------------------------------------------------------

    def pin_capture(self, rep: Replica, index: int, frozen: FrozenMachine) -> PageFiles | None:
        """A checkpoint of ``rep`` at ``index`` was captured: the pages it names stay
        until ``retain`` finds its file gone (or never written). The page files to sync
        before the file is written, or None if it names no page."""
        files = self.opened(rep.uid)
        handles = frozen.page_handles()
        if files is None or not handles:
            return None
        files.pin(index, handles)
        self._capturing.setdefault(rep.uid, Counter())[index] += 1
        return files

    def captured_done(self, rep: Replica, index: int) -> None:
        """The write of a capture pinned at ``index`` ended, written or not."""
        pending = self._capturing.get(rep.uid)
        if pending is not None and pending[index] > 0:
            pending[index] -= 1
            if not pending[index]:
                del pending[index]
        self.retain(rep)

    def retain(self, rep: Replica) -> None:
        """Unpin the pages of checkpoints no longer on disk (thinned out, dropped by a
        promotion or an installed snapshot, or never written), but those of captures
        still being written."""
        files = self.opened(rep.uid)
        if files is None:
            return
        store = self.ctx.storage.checkpoints(rep.uid)
        tags = set(store.checkpoint_indexes()) | {store.snapshot_index()}
        tags |= set(self._capturing.get(rep.uid, ()))
        files.retain(tags)

    def sendable(self, uid: str, state: bytes) -> bytes:
        """A checkpoint's state as a follower is sent it: every page it names read back
        into it (a follower has its own page files)."""
        files = self.files.get(uid)  # in a worker: a packed one is read, not unpacked here
        if isinstance(files, bytes):
            files = PageFiles.unpacked(self.ctx.storage.disk, uid, files)
        if files is None:
            return state
        return inline_snapshot(state, files.load)


__all__ = ["Pages"]
