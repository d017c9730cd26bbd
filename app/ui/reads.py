"""Engine reads shared by the dashboard's pages and its sampler for a short while.

``node.stats`` and ``node.segments`` count the live entries of every segment of the
queue (a deep queue's live set itself is built off the event loop, see
``engine.runtime.observe``), and every open tab polls them.
So a read is reused while it is younger than the caller's ``max_age_s``: a queue's
detail takes stats at most ``STATS_AGE_S`` old, the queue list's rows ``LIST_AGE_S``,
segments change only on a WAL flush or a compaction. An action on a queue forgets its
reads, so its page shows the result at once. Only what pages show is kept, at most
``ENTRIES_MAX`` reads of each kind, the oldest dropped first: the sampler, which reads
every queue, keeps its figures in its rings (``app.ui.series``), not here (a stats
read is about 2 KB, and a node may hold 10,000 queues).

A cluster node without a replica of a queue has no segments of it: its page shows those
of the queue's leader's replica, asked of that node (``QueueEngine.fresh_segments``,
within the deadline the queue's history has), and says so; when no leader answers, it
says that the map is not available and why, never an empty map passed off as its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, TypeVar

import anyio
from starlette.applications import Starlette

from engine.errors import QueueNotFound, QuorraError
from engine.runtime.api import QueueEngine, SegmentInfo

STATS_AGE_S = 2.0
"""The live parts' tick (static/app.js): a poll never shows older figures than the last."""
LIST_AGE_S = 10.0
"""The queue list's rows (at most 200 reads, about 0.5 ms each) are read again at most
this often, however many tabs poll it."""
SEGMENTS_AGE_S = 5.0
ENTRIES_MAX = 1_000
"""Reads kept of each kind: five times the queue list's rows."""

_Kept = TypeVar("_Kept")


@dataclass(frozen=True, slots=True)
class SegmentsShown:
    """The segments a queue's page shows, and whose they are."""

    segments: list[SegmentInfo]
    source: Literal["local", "leader", "absent"]
    """``local``: this node's replica; ``leader``: its leader's (no replica here);
    ``absent``: none (no replica here, and the leader did not answer)."""
    node: str | None
    """The node whose replica they are (``None`` when it is not known)."""
    detail: str = ""
    """Why they are ``absent``."""


class EngineReads:
    def __init__(self) -> None:
        self._stats: dict[str, tuple[float, dict[str, object]]] = {}
        self._segments: dict[str, tuple[float, list[SegmentInfo]]] = {}
        self._leaders_segments: dict[str, tuple[float, SegmentsShown]] = {}

    def stats(
        self, node: QueueEngine, name: str, max_age_s: float = STATS_AGE_S
    ) -> dict[str, object]:
        now = time.monotonic()
        kept = self._stats.get(name)
        if kept is not None and now - kept[0] <= max_age_s:
            return kept[1]
        stats = dict(node.stats(name))
        self._keep(self._stats, name, (now, stats))
        return stats

    def segments(
        self, node: QueueEngine, name: str, max_age_s: float = SEGMENTS_AGE_S
    ) -> list[SegmentInfo]:
        now = time.monotonic()
        kept = self._segments.get(name)
        if kept is not None and now - kept[0] <= max_age_s:
            return kept[1]
        segments = node.segments(name)
        self._keep(self._segments, name, (now, segments))
        return segments

    async def segments_shown(
        self,
        node: QueueEngine,
        name: str,
        here: str,
        deadline_s: float,
        max_age_s: float = SEGMENTS_AGE_S,
    ) -> SegmentsShown:
        """This node's segments of the queue, or its leader's when there is no replica
        here (see the module's rule); an answer that came is kept as ``segments`` are."""
        try:
            return SegmentsShown(self.segments(node, name, max_age_s), "local", here)
        except QueueNotFound:
            pass  # listed, served by forwarding: no replica here
        now = time.monotonic()
        kept = self._leaders_segments.get(name)
        if kept is not None and now - kept[0] <= max_age_s:
            return kept[1]
        try:
            with anyio.fail_after(deadline_s):
                segments = await node.fresh_segments(name)
        except TimeoutError:
            why = f"its leader did not answer within {deadline_s * 1000:.0f} ms"
            return SegmentsShown([], "absent", node.leader_of(name), why)
        except QueueNotFound:
            raise
        except QuorraError as e:
            return SegmentsShown([], "absent", node.leader_of(name), e.detail)
        shown = SegmentsShown(segments, "leader", node.leader_of(name))
        self._keep(self._leaders_segments, name, (now, shown))
        return shown

    def forget(self, name: str) -> None:
        self._stats.pop(name, None)
        self._segments.pop(name, None)
        self._leaders_segments.pop(name, None)

    def forget_except(self, names: set[str]) -> None:
        for kept in (self._stats, self._segments, self._leaders_segments):
            for gone in [n for n in kept if n not in names]:
                del kept[gone]

    @staticmethod
    def _keep(kept: dict[str, _Kept], name: str, value: _Kept) -> None:
        kept.pop(name, None)  # the newest last: the first is the oldest
        if len(kept) >= ENTRIES_MAX:
            del kept[next(iter(kept))]
        kept[name] = value


def reads_of(app: Starlette) -> EngineReads:
    reads: EngineReads | None = getattr(app.state, "engine_reads", None)
    if reads is None:
        reads = app.state.engine_reads = EngineReads()
    return reads
