"""How the WAL's group commits have gone: counts, bytes and the time each write+sync took.

Rule: the writer records, anyone reads. ``WalTimes.record`` runs on the writer's thread
once per batch and costs a few operations; ``WalTimes.stats`` may run on any thread and
returns a frozen ``WalStats``. Nothing here feeds back into the engine's behaviour, so the
simulator's determinism does not depend on the clock read here.

The sync time is the one number a publisher's latency cannot get below on a single node:
a publish is answered only after the batch holding it is synced. A disk whose flushes
stall for 100 ms now and then shows it here first (``recent_max_ms``, the top buckets),
which is what an operator needs to tell a slow disk from a slow server.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

SYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds of the sync-time histogram, in seconds (a last bucket takes the rest)."""
RECENT_SYNCS = 4096
"""Syncs whose times are kept one by one, for the recent percentiles."""


@dataclass(frozen=True, slots=True)
class WalStats:
    file_seq: int
    """The WAL file being written."""
    batches: int
    """Group commits done (one write and one sync each) since the node started."""
    bytes_written: int
    sync_seconds_sum: float
    sync_buckets: tuple[int, ...]
    """Cumulative counts: syncs that took at most each bound of ``SYNC_BUCKETS_S``; the
    count of all syncs (``batches``) is the implicit last bucket."""
    recent_syncs: int
    """How many syncs the ``recent_*`` figures cover (the last ``RECENT_SYNCS`` at most)."""
    recent_p50_ms: float
    recent_p99_ms: float
    recent_max_ms: float


def _rank(n: int, percent: int) -> int:
    """Nearest-rank position of the ``percent``-th percentile among ``n`` sorted values
    (integer arithmetic: no float rounding moves it by one)."""
    return min(n - 1, max(0, -(-percent * n // 100) - 1))


class WalTimes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches = 0
        self._bytes = 0
        self._sum = 0.0
        self._buckets = [0] * (len(SYNC_BUCKETS_S) + 1)
        self._recent = np.zeros(RECENT_SYNCS, dtype=np.float64)

    @property
    def batches(self) -> int:
        """Group commits recorded so far."""
        return self._batches

    def record(self, seconds: float, nbytes: int) -> None:
        with self._lock:
            self._recent[self._batches % RECENT_SYNCS] = seconds
            self._batches += 1
            self._bytes += nbytes
            self._sum += seconds
            self._buckets[bisect_left(SYNC_BUCKETS_S, seconds)] += 1

    def stats(self, file_seq: int) -> WalStats:
        with self._lock:
            batches, nbytes, total = self._batches, self._bytes, self._sum
            buckets = list(accumulate(self._buckets[:-1]))
            recent = self._recent[: min(batches, RECENT_SYNCS)].copy()
        if len(recent):
            recent.sort()
            p50, p99, top = (float(recent[_rank(len(recent), q)]) * 1000 for q in (50, 99, 100))
        else:
            p50 = p99 = top = 0.0
        return WalStats(
            file_seq=file_seq,
            batches=batches,
            bytes_written=nbytes,
            sync_seconds_sum=total,
            sync_buckets=tuple(buckets),
            recent_syncs=len(recent),
            recent_p50_ms=round(float(p50), 3),
            recent_p99_ms=round(float(p99), 3),
            recent_max_ms=round(top, 3),
        )


__all__ = ["RECENT_SYNCS", "SYNC_BUCKETS_S", "WalStats", "WalTimes"]
