"""Time series for the dashboard's charts: a small bounded ring of samples per queue and
one for the node's totals, kept in the app (never in the engine) and lost on restart.

A task started with the app (``sampler_lifespan``) reads ``node.summary`` of every queue
each ``SAMPLE_INTERVAL_S`` (longer after a long round: ``wait_after``) on the event loop
(the engine's one-thread rule), in slices of ``SLICE_S`` with pauses between them, so
that a node with thousands of queues never stalls a request for a whole round. Pages read the rings; the newest
totals also spare the overview from visiting every queue on each render.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.applications import Starlette

from app.state import node_or_none
from app.ui.reads import EngineReads, reads_of
from engine.runtime.api import QueueEngine

SAMPLE_INTERVAL_S = 5.0
SAMPLES_MAX = 180
"""Per ring: 15 minutes at one sample every 5 s."""
SLICE_S = 0.01
PAUSE_S = 0.01
"""A round works at most ``SLICE_S`` at a time, then lets requests run for ``PAUSE_S``
(a bare ``sleep(0)`` would let a request take only one step of many)."""
WAIT_PER_ROUND_S = 4.0
"""After a round, the sampler waits at least this many times the round's duration
(besides ``SAMPLE_INTERVAL_S``): a round works at most half its duration (``SLICE_S``,
``PAUSE_S``), so sampling takes at most a tenth of the loop however many queues there
are (a round of 10,000 queues every 5 s took a fair share of a restart's receives)."""
QUEUES_TRACKED_MAX = 20_000
"""Rings kept at most (two per node's queue limit would be generous)."""
SHARED_SAMPLES_MAX = 256
"""Distinct samples of a round that rings share (``SeriesStore.add``)."""

log = logging.getLogger("quorra.ui")


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    at_ms: int
    ready: int
    unacked: int
    publish_rate: float
    deliver_rate: float
    ack_rate: float
    memory_bytes: int
    consumers: int
    memory_fixed_bytes: int = 0
    """The part of ``memory_bytes`` a queue holds whatever its depth."""


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    at_ms: int
    queues: int
    ready: int
    unacked: int
    bytes_ready: int
    publish_rate: float
    deliver_rate: float
    ack_rate: float
    memory_bytes: int
    consumers: int
    failed: int
    memory_fixed_bytes: int = 0

    @property
    def memory_per_message_bytes(self) -> float:
        """Engine memory per held message, the queues' fixed parts left out (as each
        queue's ``memory_per_message_bytes``)."""
        held = self.ready + self.unacked
        return (self.memory_bytes - self.memory_fixed_bytes) / held if held else 0.0


def _int(stats: Mapping[str, object], key: str) -> int:
    value = stats.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(stats: Mapping[str, object], key: str) -> float:
    value = stats.get(key, 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def sample_of(stats: Mapping[str, object], at_ms: int) -> Sample:
    consumers = stats.get("consumers")
    memory = stats.get("memory")
    return Sample(
        at_ms=at_ms,
        ready=_int(stats, "messages_ready"),
        unacked=_int(stats, "messages_unacked"),
        publish_rate=_float(stats, "publish_rate"),
        deliver_rate=_float(stats, "deliver_rate"),
        ack_rate=_float(stats, "ack_rate"),
        memory_bytes=_int(stats, "memory_bytes"),
        consumers=len(consumers) if isinstance(consumers, dict) else 0,
        memory_fixed_bytes=_int(memory, "fixed_bytes") if isinstance(memory, dict) else 0,
    )


def now_ms() -> int:
    return int(time.time() * 1000)


def _same_figures(a: Sample, b: Sample) -> bool:
    """Equal but for ``at_ms``."""
    return (
        a.ready == b.ready
        and a.unacked == b.unacked
        and a.publish_rate == b.publish_rate
        and a.deliver_rate == b.deliver_rate
        and a.ack_rate == b.ack_rate
        and a.memory_bytes == b.memory_bytes
        and a.consumers == b.consumers
        and a.memory_fixed_bytes == b.memory_fixed_bytes
    )


class _Run:
    """Samples of consecutive rounds with the same figures: one ``Sample`` for them all
    (an idle queue's ring is one run, not ``SAMPLES_MAX`` samples). A queue's ring is
    its newest run, each run naming the one before (``older``), and the newest how many
    samples the ring holds (``held``): no list beside them, which cost an idle queue
    more than its runs (about 120 bytes a queue)."""

    __slots__ = ("first", "held", "last", "older", "sample")
    first: int
    last: int
    held: int
    sample: Sample
    older: _Run | None

    def __init__(self, seq: int, sample: Sample, older: _Run | None) -> None:
        self.first = seq
        self.last = seq
        self.sample = sample
        self.older = older
        self.held = (older.held if older is not None else 0) + 1


def _oldest_first(newest: _Run) -> list[_Run]:
    runs = []
    run: _Run | None = newest
    while run is not None:
        runs.append(run)
        run = run.older
    runs.reverse()
    return runs


def _drop_oldest(newest: _Run) -> None:
    """Drop the oldest sample of the ring ending with ``newest``. Walks the runs: none
    but the newest knows the ring (an idle queue's has one or two; a busy queue's up to
    ``samples_max``, a few microseconds)."""
    newer, oldest = newest, newest
    while oldest.older is not None:
        newer, oldest = oldest, oldest.older
    oldest.first += 1
    if oldest.first > oldest.last:  # never the newest: it holds the sample just added
        newer.older = None
    newest.held -= 1


class SeriesStore:
    """Rings of samples by queue name, plus the node's totals.

    A queue's ring is kept as runs over the rounds (a round: the samples taken with one
    ``at_ms``, numbered in order): a sample whose figures are those of the queue's
    sample of the round before extends that run. A node of 10,000 idle queues so keeps a
    run per queue, not 180 samples (250 bytes each: 45 KB a queue after 15 minutes).
    ``queue`` gives back exactly the samples added, the last ``samples_max`` of them.
    Runs that start in the same round with the same figures share one ``Sample`` (idle
    queues look alike: 10,000 of them so hold a few samples, not 10,000 of 150 bytes)."""

    def __init__(self, samples_max: int = SAMPLES_MAX) -> None:
        assert samples_max >= 2
        self.samples_max = samples_max
        self._queues: dict[str, _Run] = {}
        """The newest run of each queue's ring."""
        self._round_ats: dict[int, int] = {}
        """at_ms of each round still named by a run, by round number."""
        self._round = -1
        self._shared: dict[Sample, Sample] = {}
        """Samples of this round kept by a run, by their value (at most
        ``SHARED_SAMPLES_MAX``)."""
        self.totals: deque[Totals] = deque(maxlen=samples_max)

    def _round_of(self, at_ms: int) -> int:
        if self._round < 0 or self._round_ats[self._round] != at_ms:
            self._round += 1
            self._round_ats[self._round] = at_ms
            self._shared.clear()
            if self._round % self.samples_max == 0:
                self._forget_rounds()
        return self._round

    def _forget_rounds(self) -> None:
        """Drop the rounds no run names any more (every ``samples_max`` rounds)."""
        oldest = min((_oldest_first(run)[0].first for run in self._queues.values()), default=None)
        for seq in [n for n in self._round_ats if oldest is None or n < oldest]:
            if seq != self._round:
                del self._round_ats[seq]

    def add(self, name: str, sample: Sample) -> None:
        last = self._queues.get(name)
        if last is None and len(self._queues) >= QUEUES_TRACKED_MAX:
            return
        seq = self._round_of(sample.at_ms)
        if last is not None and last.last == seq - 1 and _same_figures(sample, last.sample):
            last.last = seq
            last.held += 1
        else:
            last = self._queues[name] = _Run(seq, self._shared_sample(sample), last)
        if last.held > self.samples_max:
            _drop_oldest(last)

    def _shared_sample(self, sample: Sample) -> Sample:
        """An equal sample another run of this round keeps, else ``sample``."""
        shared = self._shared.get(sample)
        if shared is not None:
            return shared
        if len(self._shared) < SHARED_SAMPLES_MAX:
            self._shared[sample] = sample
        return sample

    def _samples(self, run: _Run) -> list[Sample]:
        ats = self._round_ats
        return [
            run.sample
            if ats[seq] == run.sample.at_ms
            else dataclasses.replace(run.sample, at_ms=ats[seq])
            for seq in range(run.first, run.last + 1)
        ]

    def queue(self, name: str) -> list[Sample]:
        newest = self._queues.get(name)
        if newest is None:
            return []
        return [s for run in _oldest_first(newest) for s in self._samples(run)]

    def latest(self) -> list[tuple[str, Sample]]:
        """The newest sample of every queue."""
        out = []
        for name, run in self._queues.items():
            at_ms = self._round_ats[run.last]
            sample = run.sample
            out.append(
                (
                    name,
                    sample if sample.at_ms == at_ms else dataclasses.replace(sample, at_ms=at_ms),
                )
            )
        return out

    def forget_except(self, names: set[str]) -> None:
        for gone in [n for n in self._queues if n not in names]:
            del self._queues[gone]

    def latest_totals(self) -> Totals | None:
        return self.totals[-1] if self.totals else None


def collect(node: QueueEngine, store: SeriesStore | None) -> Totals:
    """One synchronous round over every queue (``sample_round`` spreads it out)."""
    at = now_ms()
    parts = []
    for info in node.queues():
        try:
            stats = node.summary(info.name)
        except Exception:  # deleted while we looked
            continue
        sample = sample_of(stats, at)
        if store is not None:
            store.add(info.name, sample)
        parts.append((sample, _int(stats, "bytes_ready"), stats.get("status") == "failed"))
    return _sum(at, parts)


def _sum(at_ms: int, parts: list[tuple[Sample, int, bool]]) -> Totals:
    return Totals(
        at_ms=at_ms,
        queues=len(parts),
        ready=sum(s.ready for s, _b, _f in parts),
        unacked=sum(s.unacked for s, _b, _f in parts),
        bytes_ready=sum(b for _s, b, _f in parts),
        publish_rate=round(sum(s.publish_rate for s, _b, _f in parts), 3),
        deliver_rate=round(sum(s.deliver_rate for s, _b, _f in parts), 3),
        ack_rate=round(sum(s.ack_rate for s, _b, _f in parts), 3),
        memory_bytes=sum(s.memory_bytes for s, _b, _f in parts),
        consumers=sum(s.consumers for s, _b, _f in parts),
        failed=sum(1 for _s, _b, f in parts if f),
        memory_fixed_bytes=sum(s.memory_fixed_bytes for s, _b, _f in parts),
    )


async def sample_round(node: QueueEngine, store: SeriesStore, reads: EngineReads) -> Totals:
    at = now_ms()
    infos = node.queues()
    parts = []
    slice_started = time.monotonic()
    for info in infos:
        if time.monotonic() - slice_started >= SLICE_S:
            await asyncio.sleep(PAUSE_S)
            slice_started = time.monotonic()
        try:
            stats = node.summary(info.name)
        except Exception:  # deleted while we looked
            continue
        sample = sample_of(stats, at)
        store.add(info.name, sample)
        parts.append((sample, _int(stats, "bytes_ready"), stats.get("status") == "failed"))
    names = {info.name for info in infos}
    store.forget_except(names)
    reads.forget_except(names)
    totals = _sum(at, parts)
    store.totals.append(totals)
    return totals


def wait_after(round_s: float, interval_s: float) -> float:
    """Seconds to wait after a round of ``round_s`` seconds before the next one."""
    return max(interval_s, round_s * WAIT_PER_ROUND_S)


async def _run(app: FastAPI, store: SeriesStore, interval_s: float) -> None:
    # The first round waits an interval too: just after a start, every client comes back
    # at once, and the overview reads every queue itself until a round has run.
    round_s = 0.0
    while True:
        await asyncio.sleep(wait_after(round_s, interval_s))
        node = node_or_none(app.state)
        if node is not None:
            started = time.monotonic()
            try:
                await sample_round(node, store, reads_of(app))
            except Exception:
                log.exception("dashboard sampling failed")
            round_s = time.monotonic() - started


@asynccontextmanager
async def sampler_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Runs inside the app's lifespan (after the node started, stopped before it stops)."""
    store = SeriesStore()
    app.state.series = store
    task = asyncio.create_task(_run(app, store, SAMPLE_INTERVAL_S))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def store_of(app: Starlette) -> SeriesStore:
    """The app's store; a fresh one when the sampler is not running (tests, benches)."""
    store: SeriesStore | None = getattr(app.state, "series", None)
    if store is None:
        store = app.state.series = SeriesStore()
    return store
