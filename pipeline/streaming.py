"""Streaming read of a Quorra queue: consume with leases, ack only what Spark committed.

Design
------
The reader runs on the driver, in the one Python process Spark keeps for a streaming
source for the whole run of a query. It *receives* messages with a lease
(``POST .../receive``), numbers them, and hands each micro-batch to the executors inside
its partitions (Arrow record batches), so executors never talk to the queue on reads.

**Offsets carry the batch.** The end offset of a micro-batch is
``{"seq": n, "ids": [...], "receipts": [...]}``: the running count of messages handed
to Spark, and the ids and lease receipts of the messages of that micro-batch (64 hex
digits each, about 80 bytes per message in the offset log). Spark writes it to the
checkpoint's offset log before running the batch, so the identity of every batch
survives a crash or a restart of the query.

**When a batch counts as committed.** Spark runs one micro-batch at a time and calls
``latestOffset(start)`` for the next trigger only after the batch that ended at
``start`` has been written to the sink and recorded in the commit log; on a restart it
re-runs an uncommitted batch through ``partitions(start, end)``, where again everything
up to ``start`` is committed. ``commit(end)`` itself runs only when the *next*
micro-batch starts (so the last batch would wait for new data), but ``latestOffset`` is
called on every trigger, data or not. The reader therefore settles at the earliest of
``latestOffset(start)``, ``partitions(start, _)`` and ``commit(end)``: it acks the
receipts of every batch up to that offset (kept in memory, plus those in the offset
itself for batches of an earlier run), and remembers their ids as *done*.

**Leases never run out under Spark's feet.** A background thread extends the lease of
every message the reader holds and has not settled (planned batches and spare ones)
once it is past half its length (checked every ``leaseMs / 6``), so a batch may take
any time to commit, and messages settled within half a lease cost no extension. If an extension comes
back stale anyway (driver stalled for longer than the lease), the message is going to be
delivered again: when it arrives, an id the reader still holds takes the new receipt and
is not emitted twice; an id already done is acked and dropped.

**Throughput.** Two receiver threads keep up to ``maxMessagesPerTrigger`` messages
received ahead (leased and extended like the rest), so ``latestOffset`` hands over a
full batch at once while Spark runs the previous one; it waits up to ``waitMs`` for a
full batch, then takes what there is. Acks go out from a background thread, in order,
and only the acks of the batch ending at ``start`` may still be in flight while the
next batch is planned: after a crash, a restarted query settles exactly that offset
again from the offset log (its receipts, or its ids as done when the leases ended).

**A failed micro-batch gets the same messages.** Within one run, ``partitions(start,
end)`` serves the batch from memory. After a failure that stops the query, ``stop()``
returns every held, unsettled message to the queue (nack with requeue); the restarted
query re-runs the batch from the offset log, and the reader collects exactly the ids in
``end`` again: it nacks the receipts in the offset (still live if the driver died
without ``stop``) and receives until it holds every id, keeping other messages as spare
for later batches. A message that does not come back within ``recoverTimeoutMs`` (it
was dead-lettered after too many deliveries, or expired) is reported and left out.

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

import dataclasses
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from pipeline.client import Message, QuorraClient
from pipeline.options import BATCH_MESSAGES_MAX, Options
from pipeline.source import to_record_batch, with_text

log = logging.getLogger("quorra.pipeline.streaming")
DONE_IDS_MAX = 1_000_000
"""Ids of settled messages remembered to drop redeliveries of a stale ack."""
ALL_AVAILABLE_MAX = 100_000
"""Messages per micro-batch when Spark asks for everything available."""
EXTEND_CHUNK = BATCH_MESSAGES_MAX
PREFETCH_IDLE_S = 0.02
RECEIVERS = 2
ACK_WAIT_S = 300.0
"""How long planning waits for the acks of older batches before going on anyway."""
"""Receive requests in flight at once while prefetching."""
TAKE_POLL_S = 0.01
SPARE = -1


@dataclass(frozen=True)
class ArrowPartition(InputPartition):
    batch: pa.RecordBatch


def make_offset(seq: int, messages: list[Message]) -> dict[str, Any]:
    return {
        "seq": seq,
        "ids": [m.id for m in messages],
        "receipts": [m.receipt or "" for m in messages],
    }


class LeaseStreamReader(DataSourceStreamReader):
    def __init__(self, options: Options) -> None:
        self._setup(options)

    def __getstate__(self) -> dict[str, Options]:
        # Spark pickles the reader to run ``read`` on executors: only the options go.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Options]) -> None:
        self._setup(state["options"])

    def _setup(self, options: Options) -> None:
        self.options = options
        self._lock = threading.RLock()
        self._client: QuorraClient | None = None
        self._batches: dict[int, list[Message]] = {}
        """Planned, unsettled batches by end seq; receipts kept current by the keeper."""
        self._spare: list[Message] = []
        self._held: dict[int, int] = {}
        """Message id -> end seq of its batch (``SPARE`` when not in a batch yet)."""
        self._done: OrderedDict[int, None] = OrderedDict()
        self._lease_start: dict[int, float] = {}
        """Message id -> monotonic time its current lease began (receive or extend)."""
        self._settled_seq = -1
        self._threads: list[threading.Thread] = []
        self._fetchers: list[threading.Thread] = []
        self._acks: queue.SimpleQueue[list[str] | None] = queue.SimpleQueue()
        self._acks_sent = threading.Condition()
        self._ack_lists_queued = 0
        self._ack_lists_sent = 0
        self._stopping = threading.Event()

    # --- Spark's calls ------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return make_offset(0, [])

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._settle_through(start)
        want = ALL_AVAILABLE_MAX if isinstance(limit, ReadAllAvailable) else _max_rows(limit)
        self._start_fetcher()
        messages = self._take(want)
        if not messages:
            return start
        end_seq = int(start["seq"]) + len(messages)
        with self._lock:
            self._batches[end_seq] = messages
            for m in messages:
                self._held[m.id] = end_seq
        return make_offset(end_seq, messages)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[ArrowPartition]:
        self._settle_through(start)
        end_seq = int(end["seq"])
        if end_seq == int(start["seq"]):
            return []
        with self._lock:
            messages = self._batches.get(end_seq)
        if messages is None or [m.id for m in messages] != list(end["ids"]):
            messages = self._recover(end)
        chunks = _chunks(messages, self.options)
        return [ArrowPartition(to_record_batch(chunk, text=False)) for chunk in chunks]

    def read(self, partition: ArrowPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if partition.batch.num_rows:
            yield with_text(partition.batch)

    def commit(self, end: dict[str, Any]) -> None:
        self._settle_through(end)

    def stop(self) -> None:
        """Settle what was committed, return every other held message to the queue."""
        self._stopping.set()
        for fetcher in self._fetchers:
            fetcher.join(self.options.wait_ms / 1000 + 30)
        self._acks.put(None)
        for thread in self._threads:
            thread.join(30)
        with self._lock:
            held = [m for batch in self._batches.values() for m in batch] + self._spare
            self._batches.clear()
            self._spare = []
            self._held.clear()
            self._lease_start.clear()
        receipts = [m.receipt for m in held if m.receipt]
        if receipts and self._client is not None:
            try:
                for chunk in _slices(receipts, EXTEND_CHUNK):
                    self._client.nack(self.options.queue, chunk, requeue=True)
            except Exception:
                log.warning("could not return %d messages; they return at lease expiry", len(held))
        if self._client is not None:
            self._client.close()

    # --- receiving ----------------------------------------------------------------------

    def _api(self) -> QuorraClient:
        if self._client is None:
            self._client = QuorraClient(self.options.url, self.options.token)
            for target in (self._keep_leases, self._send_acks):
                self._threads.append(threading.Thread(target=target, daemon=True))
                self._threads[-1].start()
        return self._client

    def _start_fetcher(self) -> None:
        if not self._fetchers:
            self._api()
            for _ in range(RECEIVERS):
                self._fetchers.append(threading.Thread(target=self._prefetch, daemon=True))
                self._fetchers[-1].start()

    def _prefetch(self) -> None:
        """Keep up to one trigger's worth of messages received (and leased) ahead, so
        that ``latestOffset`` does not wait on the network while Spark runs a batch."""
        target = self.options.max_messages_per_trigger
        while not self._stopping.is_set():
            with self._lock:
                room = target - len(self._spare)
            if room <= 0:
                self._stopping.wait(PREFETCH_IDLE_S)
                continue
            try:
                got = self._receive(min(BATCH_MESSAGES_MAX, room), self.options.wait_ms)
            except Exception as e:
                log.warning("receive failed: %s", e)
                self._stopping.wait(1.0)
                continue
            with self._lock:
                self._spare.extend(got)
            if not got:  # the server long-polled already; a pause bounds the loop anyway
                self._stopping.wait(PREFETCH_IDLE_S)

    def _take(self, want: int) -> list[Message]:
        """Up to ``want`` prefetched messages; waits up to ``waitMs`` for a full batch."""
        deadline = time.monotonic() + self.options.wait_ms / 1000
        while True:
            with self._lock:
                if len(self._spare) >= want or time.monotonic() >= deadline:
                    out, self._spare = self._spare[:want], self._spare[want:]
                    return out
            time.sleep(TAKE_POLL_S)

    def _receive(self, ask: int, wait_ms: int) -> list[Message]:
        """Receive and keep only messages not already held or done."""
        received = self._api().receive(self.options.queue, ask, wait_ms, self.options.lease_ms)
        fresh: list[Message] = []
        done_receipts: list[str] = []
        now = time.monotonic()
        with self._lock:
            for m in received:
                if m.id in self._done:
                    done_receipts.append(m.receipt or "")
                elif m.id in self._held:
                    self._replace_receipt(m)
                else:
                    self._held[m.id] = SPARE
                    fresh.append(m)
                if m.id not in self._done:
                    self._lease_start[m.id] = now
        if done_receipts:
            log.warning("dropping %d redelivered messages already settled", len(done_receipts))
            self._api().ack(self.options.queue, done_receipts)
        return fresh

    def _replace_receipt(self, m: Message) -> None:
        seq = self._held[m.id]
        batch = self._spare if seq == SPARE else self._batches.get(seq, [])
        for i, old in enumerate(batch):
            if old.id == m.id:
                batch[i] = dataclasses.replace(old, receipt=m.receipt)
                return

    def _recover(self, end: dict[str, Any]) -> list[Message]:
        """The messages of a batch planned by an earlier run, by id, from the queue."""
        wanted = [int(i) for i in end["ids"]]
        receipts = [r for r in end["receipts"] if r]
        client = self._api()
        for chunk in _slices(receipts, EXTEND_CHUNK):
            client.nack(self.options.queue, chunk, requeue=True)
        end_seq = int(end["seq"])
        found: dict[int, Message] = {}
        wanted_set = set(wanted)
        with self._lock:
            for m in [m for batch in self._batches.values() for m in batch] + self._spare:
                if m.id in wanted_set:
                    found[m.id] = m
        deadline = time.monotonic() + self.options.recover_timeout_ms / 1000
        while len(found) < len(wanted) and time.monotonic() < deadline:
            for m in self._receive(BATCH_MESSAGES_MAX, self.options.wait_ms):
                if m.id in wanted_set:
                    found[m.id] = m
                else:
                    with self._lock:
                        self._spare.append(m)
        missing = len(wanted) - len(found)
        if missing:
            log.warning(
                "batch %d: %d messages did not come back (dead-lettered?)", end_seq, missing
            )
        messages = [found[i] for i in wanted if i in found]
        with self._lock:
            self._spare = [m for m in self._spare if m.id not in found]
            self._batches[end_seq] = messages
            for m in messages:
                self._held[m.id] = end_seq
        return messages

    # --- settling and leases ------------------------------------------------------------

    def _settle_through(self, offset: dict[str, Any]) -> None:
        """Everything up to ``offset`` is in the sink: ack it, remember its ids as done."""
        seq = int(offset["seq"])
        if seq <= self._settled_seq:
            return
        with self._lock:
            seqs = sorted(s for s in self._batches if s <= seq)
            messages = [m for s in seqs for m in self._batches.pop(s)]
            for m in messages:
                self._held.pop(m.id, None)
                self._lease_start.pop(m.id, None)
            receipts = {m.receipt for m in messages if m.receipt}
            ids = {m.id for m in messages}
            for i, r in zip(offset.get("ids", []), offset.get("receipts", []), strict=False):
                if i not in ids and i not in self._done and r:
                    receipts.add(r)
                    ids.add(i)
            for i in ids:
                self._done[i] = None
            while len(self._done) > DONE_IDS_MAX:
                self._done.popitem(last=False)
            self._settled_seq = seq
        if receipts:
            self._api()
            self._acks.put(sorted(receipts))
            self._ack_lists_queued += 1
        # At most this offset's acks stay in flight: a restart re-acks them from the
        # offset Spark hands back, but knows nothing of older batches.
        with self._acks_sent:
            self._acks_sent.wait_for(
                lambda: self._ack_lists_sent >= self._ack_lists_queued - 1, ACK_WAIT_S
            )

    def _send_acks(self) -> None:
        """Ack settled receipts in order, off Spark's thread (``None`` ends the loop)."""
        while (receipts := self._acks.get()) is not None:
            stale = 0
            try:
                for chunk in _slices(receipts, EXTEND_CHUNK):
                    stale += len(self._api().ack(self.options.queue, chunk))
            except Exception as e:  # the leases end; redeliveries are dropped as done
                log.warning("ack of %d messages failed: %s", len(receipts), e)
            if stale:
                log.info("%d acks were stale; redeliveries of those are dropped", stale)
            with self._acks_sent:
                self._ack_lists_sent += 1
                self._acks_sent.notify_all()

    def _keep_leases(self) -> None:
        """Every ``leaseMs / 6``, extend the leases that are past half their length, so
        a lease is renewed before two thirds of it have gone and a message that is
        settled soon after it arrived is never extended at all."""
        interval_s = self.options.lease_ms / 6000
        client = QuorraClient(self.options.url, self.options.token)
        try:
            while not self._stopping.wait(interval_s):
                self._extend_once(client)
        finally:
            client.close()

    def _extend_once(self, client: QuorraClient) -> None:
        now = time.monotonic()
        due_s = self.options.lease_ms / 2000
        with self._lock:
            held = [m for batch in self._batches.values() for m in batch] + self._spare
            due = [m for m in held if m.receipt and now - self._lease_start.get(m.id, 0) > due_s]
        try:
            for chunk in _chunks_of(due, EXTEND_CHUNK):
                receipts = [m.receipt or "" for m in chunk]
                stale = set(client.extend(self.options.queue, receipts, self.options.lease_ms))
                with self._lock:
                    for k, m in enumerate(chunk):
                        if k not in stale and m.id in self._lease_start:
                            self._lease_start[m.id] = now
                if stale:
                    log.warning("%d leases had expired; those messages come back", len(stale))
        except Exception as e:  # the next round retries; a lease is 6 rounds long
            log.warning("lease extension failed: %s", e)


def _chunks_of(items: list[Message], size: int) -> Iterator[list[Message]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _max_rows(limit: ReadLimit) -> int:
    if isinstance(limit, ReadMaxRows):
        return max(1, int(limit.max_rows))
    return ALL_AVAILABLE_MAX


def _chunks(messages: list[Message], options: Options) -> list[list[Message]]:
    parts = max(1, min(options.num_partitions, len(messages) // 1000 or 1))
    size = -(-len(messages) // parts)
    return [messages[i : i + size] for i in range(0, len(messages), size)]


def _slices(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
