"""Streaming read of a Quorra queue: consume with leases, ack only what Spark committed.

Design
------
The reader runs on the driver, in the one Python process Spark keeps for a streaming
source for the whole run of a query. It consumes on streams (``quorra.client.Stream``,
WebSockets: the server pushes deliveries up to a prefetch credit), numbers the messages,
and hands each micro-batch to the executors inside its partitions (Arrow record
batches), so executors never talk to the queue on reads.

**Offsets carry the batch.** The end offset of a micro-batch is ``{"seq": n, "runs":
[[first, last], ...]}`` (``pipeline.offsets``): the running count of messages handed to
Spark and the ids of the messages of that micro-batch, as runs of consecutive ids (a
batch is taken lowest ids first, so it is a few runs, not a list of every id). Spark writes it to the checkpoint's offset log before running the
batch, so the identity of every batch survives a crash or a restart of the query.
Receipts are not kept there: a lease belongs to the connection that received it, and
the server returns every lease of a connection at once when it closes (the driver died
or ``stop()``), so no receipt of an earlier run is of any use.

**When a batch counts as committed.** Spark runs one micro-batch at a time and calls
``latestOffset(start)`` for the next trigger only after the batch that ended at
``start`` has been written to the sink and recorded in the commit log; on a restart it
re-runs an uncommitted batch through ``partitions(start, end)``, where again everything
up to ``start`` is committed. ``commit(end)`` itself runs only when the *next*
micro-batch starts (so the last batch would wait for new data), but ``latestOffset`` is
called on every trigger, data or not. The reader therefore settles at the earliest of
``latestOffset(start)``, ``partitions(start, _)`` and ``commit(end)``: it acks the
receipts of every batch up to that offset on the connections that delivered them (an
ack gives their credit back), and remembers their ids, and the offset's, as *done*.

**Leases never run out under Spark's feet.** A background thread extends the lease of
every message the reader holds and has not settled (planned batches and spare ones)
once it is past half its length (checked every ``leaseMs / 6``), so a batch may take
any time to commit, and messages settled within half a lease cost no extension. If a
lease ends anyway (driver stalled for longer than the lease, or a connection dropped
and was reopened), the message is delivered again: an id the reader still holds takes
the new receipt and is not emitted twice; an id already done is acked and dropped.

**Throughput.** The reader opens as many connections as make a credit of two
micro-batches (``maxMessagesPerTrigger`` each; a connection holds at most the server's
``prefetch_max``, at most ``STREAMS_MAX`` connections), one reader thread each, so the
next batch is delivered while Spark runs the current one; ``latestOffset`` waits up to
``waitMs`` for a full batch, then takes what there is. Acks are sent at once and
answered later; only the acks of the batch ending at ``start`` may still be unanswered
while the next batch is planned: after a crash, a restarted query knows exactly that
offset's ids from the offset log, and drops their redeliveries as done.

**Columns, not objects.** The reader consumes with ``columns`` (columnar deliver
frames, ``quorra.client.DeliveredColumns``): each frame becomes one ``Run``, its Arrow
rows built from the frame's buffers, and the books (spare, planned batches, held and
done ids, leases, the connection to ack on) are kept per run with set and numpy
operations, so a message costs no Python object or step of its own on the way to
Spark; only a run with a redelivered message (a lease ran out, a connection dropped)
is looked at message by message. A batch's partitions are its runs' rows in id order,
concatenated once per partition, holding only the columns the query reads (a schema
given to ``readStream``: ``pipeline.source.read_columns``); ``body_text`` is computed
where the partition is read, never shipped.

**A failed micro-batch gets the same messages.** Within one run, ``partitions(start,
end)`` serves the batch from memory. After a failure that stops the query, ``stop()``
closes the connections, which returns every held, unsettled message to the queue; the
restarted query re-runs the batch from the offset log, and the reader consumes until it
holds every id in ``end`` again, keeping other messages as spare for later batches. A
message that does not come back within ``recoverTimeoutMs`` (it was dead-lettered after
too many deliveries, expired, or is out of reach of the credit) is reported and left out.

**Limits.** Exactly-once holds for a sink that Spark makes idempotent per batch (file
sink, ``foreachBatch`` keyed by batch id, the ``quorra`` stream writer) and for queries
restarted from their checkpoint. The reader cannot tell whether the batch running when
the query is stopped reached the commit log, so ``stop()`` returns it to the queue with
the rest: a restart from the same checkpoint drops it (its ids are in the offset log,
so they are done), but another consumer of the queue would receive it again. One
streaming query per queue and checkpoint; asynchronous progress tracking is not
supported. The done-id memory is bounded (``DONE_IDS_MAX``).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from pipeline.offsets import id_array_runs, make_offset, offset_id_array
from pipeline.options import BATCH_MESSAGES_MAX, Options
from pipeline.source import READ_COLUMNS, columns_record_batch, project, shipped
from quorra.client import DeliveredColumns, Problem, Settled, Stream

log = logging.getLogger("quorra.pipeline.streaming")
DONE_IDS_MAX = 1_000_000
"""Ids of settled messages remembered to drop redeliveries of a stale ack."""
ALL_AVAILABLE_MAX = 100_000
"""Messages per micro-batch when Spark asks for everything available."""
STREAMS_MAX = 8
"""Stream connections of one reader: each holds at most the server's ``prefetch_max``
deliveries, and the reader wants two micro-batches' worth (the one Spark runs, the next)."""
SETTLE_CHUNK = BATCH_MESSAGES_MAX
READ_POLL_S = 0.05
"""How long a connection's reader thread waits for a frame before checking for stop."""
RECONNECT_S = 1.0
ACK_WAIT_S = 300.0
"""How long planning waits for the acks of older batches before going on anyway."""
STOP_ACK_WAIT_S = 30.0
IdArray = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class ArrowPartition(InputPartition):
    batch: pa.RecordBatch


@dataclass(eq=False)
class Run:
    """Messages delivered together on one connection (a deliver frame, or a part of
    one), as columns: their ids, receipts and Arrow rows, and the connection and time
    of their current lease. The reader's books are runs, not an object per message."""

    ids: IdArray
    receipts: list[str]
    rows: pa.RecordBatch
    via: int
    """The connection that delivered the current receipts (acks and nacks must go
    there: they give that connection's credit back)."""
    leased_at: float
    """Monotonic time the current leases began (delivery or extend)."""

    @staticmethod
    def of(columns: DeliveredColumns, via: int, now: float) -> Run:
        return Run(
            columns.ids.astype(np.int64),
            columns.receipt_list(),
            columns_record_batch(columns),
            via,
            now,
        )

    def __len__(self) -> int:
        return len(self.receipts)

    def select(self, keep: np.ndarray[Any, np.dtype[np.bool_]]) -> Run:
        """The messages where ``keep`` is true."""
        at = np.flatnonzero(keep)
        receipts = self.receipts
        return Run(
            self.ids[at],
            [receipts[i] for i in at.tolist()],
            self.rows.take(pa.array(at)),
            self.via,
            self.leased_at,
        )

    def split(self, k: int) -> tuple[Run, Run]:
        """The first ``k`` messages and the rest."""
        return (
            Run(self.ids[:k], self.receipts[:k], self.rows.slice(0, k), self.via, self.leased_at),
            Run(self.ids[k:], self.receipts[k:], self.rows.slice(k), self.via, self.leased_at),
        )


def stream_count(credit: int, prefetch_max: int) -> int:
    """Connections so that their prefetch credits add up to ``credit``."""
    return max(1, min(STREAMS_MAX, math.ceil(credit / prefetch_max)))


class LeaseStreamReader(DataSourceStreamReader):
    def __init__(self, options: Options, columns: tuple[str, ...] = READ_COLUMNS) -> None:
        self._setup(options, columns)

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run ``read`` on executors: only the options go.
        return {"options": self.options, "columns": self.columns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["options"], state.get("columns", READ_COLUMNS))

    def _setup(self, options: Options, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns
        """The query's columns (``pipeline.source.read_columns``)."""
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        """Notified when deliveries or settle answers arrived."""
        self._streams: list[Stream | None] = []
        self._prefetch = 0
        self._batches: dict[int, list[Run]] = {}
        """Planned, unsettled batches by end seq; receipts kept current by the readers."""
        self._batch_runs: dict[int, list[list[int]]] = {}
        """The id runs of each planned batch's offset."""
        self._spare: list[Run] = []
        """Delivered messages not in a batch yet, the first delivered first."""
        self._spare_count = 0
        self._held: set[int] = set()
        """Ids of the messages in ``_batches`` and ``_spare``."""
        self._done: set[int] = set()
        self._done_order: deque[list[int]] = deque()
        """The ids added to ``_done``, oldest first (the oldest are forgotten first)."""
        self._settled_seq = -1
        self._refs = itertools.count(1)
        self._unanswered: dict[int, int] = {}
        """Ref of each settle frame whose answer has not come back yet -> its connection
        (a connection that drops answers none of its own any more)."""
        self._previous_acks: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    # --- Spark's calls ------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return make_offset(0, ())

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._settle_through(start)
        want = ALL_AVAILABLE_MAX if isinstance(limit, ReadAllAvailable) else _max_rows(limit)
        self._start_consumers()
        runs = self._take(want)
        if not runs:
            return start
        ids = np.concatenate([run.ids for run in runs])
        end_seq, id_runs = int(start["seq"]) + len(ids), id_array_runs(ids)
        with self._lock:
            self._batches[end_seq] = runs
            self._batch_runs[end_seq] = id_runs
        return {"seq": end_seq, "runs": id_runs}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ArrowPartition]:
        self._settle_through(start)
        end_seq = int(end["seq"])
        if end_seq == int(start["seq"]):
            return []
        with self._lock:
            runs = self._batches.get(end_seq)
            planned = self._batch_runs.get(end_seq)
        if runs is None or planned != _runs_of(end):
            runs = self._recover(end)
        return partitions_of(runs, self.options, self.columns)

    def read(self, partition: ArrowPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if partition.batch.num_rows:
            yield project(partition.batch, self.columns)

    def commit(self, end: dict[str, Any]) -> None:
        self._settle_through(end)

    def stop(self) -> None:
        """Settle what was committed, return every other held message to the queue: the
        server does so at once when a connection closes (nack with requeue)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._unanswered, STOP_ACK_WAIT_S)
        self._stopping.set()
        for thread in self._threads:
            thread.join(30)
        with self._lock:
            streams, self._streams = self._streams, []
            self._batches.clear()
            self._batch_runs.clear()
            self._spare = []
            self._spare_count = 0
            self._held.clear()
        for stream in streams:
            if stream is not None:
                stream.close()

    # --- receiving ----------------------------------------------------------------------

    def _open(self) -> Stream:
        stream = Stream(self.options.url, self.options.token, self.options.queue)
        if self._prefetch:
            stream.consume(self._prefetch, lease_ms=self.options.lease_ms, columns=True)
        return stream

    def _start_consumers(self) -> None:
        """Open the connections (once): as many as make a credit of two micro-batches,
        each consuming with its share, and a reader thread for each plus the keeper of
        leases."""
        if self._threads:
            return
        first = Stream(self.options.url, self.options.token, self.options.queue)
        prefetch_max = first.ledger.prefetch_max
        credit = 2 * self.options.max_messages_per_trigger
        count = stream_count(credit, prefetch_max)
        self._prefetch = min(prefetch_max, math.ceil(credit / count))
        first.consume(self._prefetch, lease_ms=self.options.lease_ms, columns=True)
        self._streams = [first, *(self._open() for _ in range(count - 1))]
        for i in range(count):
            self._threads.append(threading.Thread(target=self._read_loop, args=(i,), daemon=True))
        self._threads.append(threading.Thread(target=self._keep_leases, daemon=True))
        for thread in self._threads:
            thread.start()

    def _read_loop(self, index: int) -> None:
        """Read connection ``index``'s frames into the reader's books; reopen it (after
        ``RECONNECT_S``) when it drops: the server returned its leases then, and the
        messages come back with new receipts."""
        while not self._stopping.is_set():
            stream = self._streams[index] if index < len(self._streams) else None
            if stream is None:
                try:
                    stream = self._open()
                except (Problem, OSError) as e:
                    log.warning("stream %d: could not reconnect: %s", index, e)
                    self._stopping.wait(RECONNECT_S)
                    continue
                with self._lock:
                    self._streams[index] = stream
            try:
                if stream.read(READ_POLL_S):
                    self._absorb(index, stream)
            except (Problem, OSError) as e:
                log.warning("stream %d dropped: %s", index, e)
                with self._changed:
                    if index < len(self._streams):
                        self._streams[index] = None
                    for ref in [r for r, via in self._unanswered.items() if via == index]:
                        del self._unanswered[ref]
                    self._changed.notify_all()
                self._stopping.wait(RECONNECT_S)

    def _absorb(self, index: int, stream: Stream) -> None:
        """Take what the frame brought: deliveries (keeping only messages not already
        held or done) and the answers of acks. A run of messages none of which is held
        or done (every run but after a lease ran out or a connection dropped) is kept
        whole, with no step per message in Python."""
        ledger = stream.ledger
        delivered = list(ledger.delivered_columns)
        ledger.delivered_columns.clear()
        answers = list(ledger.answers.items())
        ledger.answers.clear()
        if not delivered and not answers:
            return
        now = time.monotonic()
        runs = [Run.of(columns, index, now) for columns in delivered if len(columns)]
        redelivered_done: list[str] = []
        replaced: dict[int, list[str]] = defaultdict(list)
        with self._changed:
            for ref, answer in answers:
                self._unanswered.pop(int(ref), None)
                _report(answer)
            for run in runs:
                ids = run.ids.tolist()
                if self._held.isdisjoint(ids) and self._done.isdisjoint(ids):
                    self._held.update(ids)
                    self._spare.append(run)
                    self._spare_count += len(run)
                else:
                    redelivered_done += self._absorb_again(run, ids, replaced)
            self._changed.notify_all()
        if redelivered_done:
            log.warning("dropping %d redelivered messages already settled", len(redelivered_done))
            self._send_settle("ack", index, redelivered_done)
        for via, receipts in replaced.items():
            # The old receipts are stale; acking them gives their connection's credit back.
            self._send_settle("ack", via, receipts)

    def _absorb_again(self, run: Run, ids: list[int], replaced: dict[int, list[str]]) -> list[str]:
        """A run with messages already held or done (lock held): a done one is to be
        acked and dropped (its receipt returned), a held one takes the new delivery's
        place where the old one was (the old receipt goes into ``replaced`` under its
        connection), the others go to spare."""
        done = np.fromiter((i in self._done for i in ids), bool, len(ids))
        held = np.fromiter((i in self._held for i in ids), bool, len(ids)) & ~done
        for k in np.flatnonzero(held).tolist():
            self._replace(run.select(run.ids == ids[k]), replaced)
        fresh = ~(done | held)
        if fresh.any():
            kept = run.select(fresh)
            self._held.update(kept.ids.tolist())
            self._spare.append(kept)
            self._spare_count += len(kept)
        return [run.receipts[k] for k in np.flatnonzero(done).tolist()]

    def _replace(self, new: Run, replaced: dict[int, list[str]]) -> None:
        """Put the new delivery of a held message (a run of one) where the old one is, in
        spare or in its batch; the old receipt into ``replaced``."""
        id_ = int(new.ids[0])
        for place in [self._spare, *self._batches.values()]:
            for i, old in enumerate(place):
                at = np.flatnonzero(old.ids == id_)
                if len(at):
                    replaced[old.via].append(old.receipts[int(at[0])])
                    rest = old.select(old.ids != id_)
                    place[i : i + 1] = [rest] if len(rest) else []
                    place.append(new)
                    return

    def _take(self, want: int) -> list[Run]:
        """Up to ``want`` delivered messages, the first delivered (``partitions`` orders
        a batch by id: each receive on a connection delivers a run of ids, so a batch's
        offset is about one run of ids per receive); waits up to ``waitMs`` for a full
        batch."""
        out: list[Run] = []
        with self._changed:
            self._changed.wait_for(lambda: self._spare_count >= want, self.options.wait_ms / 1000)
            got = 0
            while self._spare and got < want:
                run = self._spare[0]
                if got + len(run) <= want:
                    out.append(self._spare.pop(0))
                    got += len(run)
                else:
                    first, self._spare[0] = run.split(want - got)
                    out.append(first)
                    got = want
            self._spare_count -= got
        return out

    def _recover(self, end: dict[str, Any]) -> list[Run]:
        """The messages of a batch planned by an earlier run, by id: that run's
        connections closed, so the server returned them, and they are delivered again."""
        wanted = offset_id_array(end)
        end_seq = int(end["seq"])
        self._start_consumers()
        deadline = time.monotonic() + self.options.recover_timeout_ms / 1000

        def places() -> list[list[Run]]:
            return [self._spare, *self._batches.values()]

        def found() -> int:
            return sum(int(np.isin(r.ids, wanted).sum()) for p in places() for r in p)

        with self._changed:
            while found() < len(wanted) and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(min(left, 1.0))
            runs: list[Run] = []
            for place in places():
                kept: list[Run] = []
                for run in place:
                    mask = np.isin(run.ids, wanted)
                    if not mask.any():
                        kept.append(run)
                        continue
                    runs.append(run.select(mask))
                    if place is self._spare:
                        self._spare_count -= int(mask.sum())
                    if not mask.all():
                        kept.append(run.select(~mask))
                place[:] = kept
            self._batches[end_seq] = runs
            self._batch_runs[end_seq] = _runs_of(end)
        missing = len(wanted) - sum(map(len, runs))
        if missing:
            log.warning(
                "batch %d: %d messages did not come back (dead-lettered?)", end_seq, missing
            )
        return runs

    # --- settling and leases ------------------------------------------------------------

    def _settle_through(self, offset: dict[str, Any]) -> None:
        """Everything up to ``offset`` is in the sink: ack it, remember its ids as done."""
        seq = int(offset["seq"])
        if seq <= self._settled_seq:
            return
        by_stream: dict[int, list[str]] = defaultdict(list)
        with self._lock:
            for s in sorted(s for s in self._batches if s <= seq):
                self._batch_runs.pop(s, None)
                for run in self._batches.pop(s):
                    by_stream[run.via].extend(run.receipts)
                    ids = run.ids.tolist()
                    self._held.difference_update(ids)
                    self._remember_done(ids)
            # Ids of the offset from an earlier run: those messages came back when its
            # connections closed; a redelivery of one is acked and dropped.
            self._remember_done(offset_id_array(offset).tolist())
            self._settled_seq = seq
        older = self._previous_acks
        self._previous_acks = {
            ref for via, receipts in by_stream.items() for ref in self._acks(via, receipts)
        }
        # At most this offset's acks stay in flight: a restart knows this offset's ids
        # (from the offset log), nothing of older batches.
        with self._changed:
            if not self._changed.wait_for(lambda: older.isdisjoint(self._unanswered), ACK_WAIT_S):
                log.warning("acks of an older batch not answered in %s s", ACK_WAIT_S)

    def _remember_done(self, ids: list[int]) -> None:
        """Add ``ids`` to the done ids, forgetting the oldest past ``DONE_IDS_MAX``."""
        self._done.update(ids)
        self._done_order.append(ids)
        while len(self._done) > DONE_IDS_MAX and len(self._done_order) > 1:
            self._done.difference_update(self._done_order.popleft())

    def _acks(self, via: int, receipts: list[str]) -> list[int]:
        """Ack ``receipts`` on connection ``via``; the refs of the frames."""
        return [self._send_settle("ack", via, chunk) for chunk in _slices(receipts)]

    def _send_settle(self, how: str, via: int, receipts: list[str]) -> int:
        """One settle frame on connection ``via`` (at most ``SETTLE_CHUNK`` receipts); its
        ref. A connection that dropped has returned its leases: nothing is sent then."""
        ref = next(self._refs)
        with self._lock:
            stream = self._streams[via] if via < len(self._streams) else None
            if stream is None:
                return ref
            self._unanswered[ref] = via
        try:
            if how == "ack":
                stream.ack(receipts, ref=ref)
            else:
                stream.extend(receipts, self.options.lease_ms, ref=ref)
        except Problem as e:
            log.warning("%s of %d messages not sent: %s", how, len(receipts), e)
            with self._lock:
                self._unanswered.pop(ref, None)
        return ref

    def _keep_leases(self) -> None:
        """Every ``leaseMs / 6``, extend the leases that are past half their length, so
        a lease is renewed before two thirds of it have gone and a message that is
        settled soon after it arrived is never extended at all."""
        interval_s = self.options.lease_ms / 6000
        while not self._stopping.wait(interval_s):
            self._extend_once()

    def _extend_once(self) -> None:
        now = time.monotonic()
        due_s = self.options.lease_ms / 2000
        by_stream: dict[int, list[str]] = defaultdict(list)
        with self._lock:
            for place in [self._spare, *self._batches.values()]:
                for run in place:
                    if now - run.leased_at > due_s:
                        by_stream[run.via].extend(run.receipts)
                        run.leased_at = now
        for via, receipts in by_stream.items():
            for chunk in _slices(receipts):
                self._send_settle("extend", via, chunk)


def _report(answer: Settled | Problem) -> None:
    if isinstance(answer, Problem):
        log.warning("a settle failed: %s", answer)
    elif answer.stale:
        log.info("%d receipts were stale; redeliveries of those are dropped", len(answer.stale))


def _max_rows(limit: ReadLimit) -> int:
    if isinstance(limit, ReadMaxRows):
        return max(1, int(limit.max_rows))
    return ALL_AVAILABLE_MAX


def _runs_of(offset: dict[str, Any]) -> list[list[int]]:
    """An offset's id runs (an old offset's id list made runs)."""
    if "runs" in offset:
        return [[int(first), int(last)] for first, last in offset["runs"]]
    return id_array_runs(offset_id_array(offset))


def partitions_of(
    runs: list[Run], options: Options, columns: tuple[str, ...] = READ_COLUMNS
) -> list[ArrowPartition]:
    """A batch's messages in id order, in up to ``numPartitions`` Arrow batches of at
    least 1,000 rows, each in buffers of its own (a partition is pickled whole) and with
    only the shipped columns that ``columns`` need. Runs are
    each in id order as a receive delivers them: sorted by their first ids they are
    usually the batch in id order, and each partition is then its runs' slices
    concatenated (one copy); otherwise the rows are taken in id order."""
    runs = sorted((run for run in runs if len(run)), key=lambda run: int(run.ids[0]))
    if not runs:
        return []
    ids = np.concatenate([run.ids for run in runs])
    n = len(ids)
    parts = max(1, min(options.num_partitions, n // 1000 or 1))
    size = -(-n // parts)
    bounds = range(0, n, size)
    if np.any(ids[1:] <= ids[:-1]):
        rows = pa.concat_batches([shipped(run.rows, columns) for run in runs])
        order = pa.array(np.argsort(ids, kind="stable"))
        return [ArrowPartition(rows.take(order[at : at + size])) for at in bounds]
    starts = np.cumsum([0, *map(len, runs)]).tolist()
    out = []
    for at in bounds:
        until = min(at + size, n)
        pieces = [
            shipped(run.rows, columns).slice(
                max(at - first, 0), min(until, first + len(run)) - max(at, first)
            )
            for run, first in zip(runs, starts, strict=False)
            if first < until and first + len(run) > at
        ]
        out.append(ArrowPartition(pa.concat_batches(pieces)))
    return out


def _slices(items: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), SETTLE_CHUNK):
        yield items[i : i + SETTLE_CHUNK]
