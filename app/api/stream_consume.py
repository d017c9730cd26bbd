"""The consume side of a stream (app/api/stream.py): credit, deliveries and settles.

Rule: the server keeps at most ``prefetch`` messages delivered and not yet acked or
nacked on the connection (``outstanding``), pushing more as they arrive; ``ack``,
``nack`` and ``extend`` settle receipts as the REST endpoints do. Acks that come while
the consumer waits for the credit they give ride on its next receive (one Raft entry
settles them and leases the next batch, as a REST receive carrying ``ack``); each ack
frame is still answered by itself, as if settled alone. At close, acks left to carry
are settled and the leases still held here are returned at once (nack with requeue).

The connection remembers which seal made each receipt it delivered
(engine/queue/receipts.py): an ack or nack whose receipts were all delivered here, once
each, by the queue's seal hands them back as ``SealedReceipts`` of that seal, whose MACs
are then not computed a second time. Any other receipt (forged, another connection's,
repeated) goes as a plain list, each MAC checked; staleness is the machine's either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi.exceptions import RequestValidationError

from app.api import message_bodies
from app.api.queue_schemas import CONSUMER_CHARS_MAX
from app.api.stream_frames import FrameError, error_frame, forbidden, ref_of, refusal
from app.auth import Principal
from app.deliver_frames import FrameChunks, deliver_chunks, deliver_column_chunks
from engine.errors import QuorraError, ValidationFailed
from engine.limits import Limits
from engine.queue.receipts import ReceiptSeal, SealedReceipts
from engine.runtime.api import QueueEngine, SettleResult

log = logging.getLogger("quorra.app")

CONSUME_KEYS = frozenset({"op", "prefetch", "lease_ms", "consumer", "columns"})
RETRY_S_DEFAULT = 1.0
"""How long a consumer waits after an engine error without a ``Retry-After``."""


class FrameLink(Protocol):
    """What the consumer needs of its connection: whether it is closed, and sending."""

    @property
    def closed(self) -> bool: ...

    async def send(self, frame: dict[str, object]) -> None: ...

    async def send_packed(self, frame: bytes | FrameChunks) -> None: ...


@dataclass(frozen=True, slots=True)
class CarriedAck:
    """An ack frame whose receipts the consumer's next receive settles."""

    args: message_bodies.SettleArgs
    about: dict[str, object]
    """Its ``ref``, echoed in the answer."""


def settle_frame(how: str, frame: dict[str, Any]) -> message_bodies.SettleArgs:
    payload = {k: v for k, v in frame.items() if k not in ("op", "ref")}
    try:
        return message_bodies.settle_args(how, payload)
    except (RequestValidationError, QuorraError) as e:
        raise FrameError(refusal(e), of=how, **ref_of(frame)) from None


class StreamConsumer:
    """The consume side of one connection; its ``consume_loop`` is a task of it."""

    def __init__(
        self,
        link: FrameLink,
        node: QueueEngine,
        name: str,
        who: Principal,
        limits: Limits,
    ) -> None:
        self.link, self.node, self.name, self.who, self.limits = link, node, name, who, limits
        # receipts delivered here and not yet acked or nacked
        self.prefetch = 0
        self.lease_ms: int | None = None
        self.consumer = who.token_id or who.name
        self.columns = False
        """Deliver frames in the columnar form (``consume`` with ``columns``: true)."""
        self.outstanding: dict[str, ReceiptSeal | None] = {}
        """By receipt: the seal that made it (None: one of a peer's, not known here)."""
        self.credit = asyncio.Event()
        self.settle_slots = asyncio.Semaphore(limits.stream_settles_inflight_max)
        self.settles: set[asyncio.Task[None]] = set()
        # acks for the consumer's next receive to carry (one Raft entry settles them and
        # leases the next batch): taken only while it waits for the credit they give
        self.carried: list[CarriedAck] = []
        self.carried_receipts = 0
        self.waiting_credit = False

    def wake(self) -> None:
        """Wake the consume loop (the connection closed)."""
        self.credit.set()

    def on_consume(self, frame: dict[str, Any]) -> None:
        if not self.who.can("read", self.name):
            raise FrameError(forbidden(self.who, self.name, "read"), of="consume")
        limits = self.limits
        prefetch, lease_ms = frame.get("prefetch"), frame.get("lease_ms")
        consumer, columns = frame.get("consumer"), frame.get("columns", False)
        if not CONSUME_KEYS.issuperset(frame):
            unknown = sorted(str(k) for k in frame if k not in CONSUME_KEYS)
            raise FrameError(ValidationFailed(f"unknown fields {unknown}"), of="consume")
        if type(prefetch) is not int or not 0 <= prefetch <= limits.stream_prefetch_max:
            raise FrameError(
                ValidationFailed(f"prefetch must be an integer 0..{limits.stream_prefetch_max}"),
                of="consume",
            )
        if lease_ms is not None and (
            type(lease_ms) is not int or not 1 <= lease_ms <= limits.lease_ms_max
        ):
            raise FrameError(
                ValidationFailed(f"lease_ms must be an integer 1..{limits.lease_ms_max}"),
                of="consume",
            )
        if consumer is not None and (
            type(consumer) is not str
            or not 1 <= len(consumer) <= CONSUMER_CHARS_MAX
            or not _is_text(consumer)
        ):
            raise FrameError(
                ValidationFailed(f"consumer must be text of 1..{CONSUMER_CHARS_MAX} characters"),
                of="consume",
            )
        if type(columns) is not bool:
            raise FrameError(ValidationFailed("columns must be true or false"), of="consume")
        self.prefetch, self.lease_ms, self.columns = prefetch, lease_ms, columns
        if consumer is not None:
            self.consumer = consumer
        self.credit.set()

    async def consume_loop(self) -> None:
        limits = self.limits
        while not self.link.closed:
            room = self.prefetch - len(self.outstanding)
            if room <= 0:
                if self.carried:  # the credit was taken back meanwhile (a lower prefetch)
                    await self._settle_apart()
                self.credit.clear()
                self.waiting_credit = True
                try:
                    await self.credit.wait()
                finally:
                    self.waiting_credit = False
                continue
            carried, self.carried, self.carried_receipts = self.carried, [], 0
            try:
                batch = await self.node.ack_and_receive(
                    self.name,
                    ack=_joined([ack.args.receipts for ack in carried]),
                    consumer=self.consumer,
                    max_messages=min(room, limits.receive_messages_max),
                    # carried acks are answered now, not after a long poll
                    wait_ms=0 if carried else limits.stream_receive_wait_ms,
                    lease_ms=self.lease_ms,
                )
            except QuorraError as e:
                for ack in carried:
                    await self.link.send(error_frame(e, of="ack", **ack.about))
                await self._consume_failed(e)
                continue
            await self._answer_carried(carried, batch.settled)
            if self.link.closed:
                await self._give_back(batch.receipts)
                return
            if batch.ids:
                self.outstanding.update(dict.fromkeys(batch.receipts, _seal_of(batch.receipts)))
                frame = deliver_column_chunks(batch) if self.columns else deliver_chunks(batch)
                await self.link.send_packed(frame)

    async def _consume_failed(self, e: QuorraError) -> None:
        """Tell the client; wait and try again after a passing error (no leader, full),
        stop consuming after a lasting one (the queue is gone) until asked again."""
        await self.link.send(error_frame(e, of="consume"))
        if e.status < 500 and e.status != 429:
            self.prefetch = 0
            return
        delay_s = e.retry_after_s if e.retry_after_s is not None else RETRY_S_DEFAULT
        with contextlib.suppress(TimeoutError):
            self.credit.clear()
            await asyncio.wait_for(self.credit.wait(), delay_s)

    async def on_settle(self, how: str, frame: dict[str, Any]) -> None:
        if not self.who.can("read", self.name):
            raise FrameError(forbidden(self.who, self.name, "read"), of=how, **ref_of(frame))
        args = settle_frame(how, frame)
        if how != "extend":  # settled or stale: either way no longer this connection's
            args = self._taken(args)
            self.credit.set()
            if how == "ack" and self._may_carry(args.receipts):
                self.carried.append(CarriedAck(args, ref_of(frame)))
                self.carried_receipts += len(args.receipts)
                return
        await self._spawn_settle(how, args, ref_of(frame))

    def _taken(self, args: message_bodies.SettleArgs) -> message_bodies.SettleArgs:
        """``args``, its receipts no longer outstanding here; as ``SealedReceipts`` when
        each was outstanding (so delivered here, and named once) and one seal made them
        all."""
        pop = self.outstanding.pop
        seals = [pop(receipt, None) for receipt in args.receipts]
        seal = seals[0] if seals else None
        if seal is None or seals.count(seal) != len(seals):
            return args
        return replace(args, receipts=SealedReceipts(args.receipts, seal))

    async def _spawn_settle(
        self, how: str, args: message_bodies.SettleArgs, about: dict[str, object]
    ) -> None:
        await self.settle_slots.acquire()  # at the bound, the socket is not read
        task = asyncio.get_running_loop().create_task(self._settle(how, args, about))
        self.settles.add(task)
        task.add_done_callback(self.settles.discard)

    async def _settle(
        self, how: str, args: message_bodies.SettleArgs, about: dict[str, object]
    ) -> None:
        try:
            if how == "ack":
                result = await self.node.ack(self.name, args.receipts)
            elif how == "nack":
                result = await self.node.nack(self.name, args.receipts, requeue=args.requeue)
            else:
                result = await self.node.extend(self.name, args.receipts, args.lease_ms)
        except QuorraError as e:
            await self.link.send(error_frame(e, of=how, **about))
            return
        finally:
            self.settle_slots.release()
        stale = [args.receipts[i] for i in result.stale]
        await self.link.send(
            {"op": "settled", "of": how, "settled": result.settled, "stale": stale, **about}
        )

    def _may_carry(self, receipts: list[str]) -> bool:
        """Whether the consumer's next receive is to carry these acks: it waits for the
        credit they give (so it receives at once, settling them in the same entry) and
        they fit one receive's acks."""
        return (
            self.waiting_credit
            and not self.link.closed
            and self.prefetch > len(self.outstanding)
            and self.carried_receipts + len(receipts) <= self.limits.receive_messages_max
        )

    async def _answer_carried(self, carried: list[CarriedAck], result: SettleResult) -> None:
        """A ``settled`` frame per carried ack, as if each had been settled alone: its own
        stale receipts, the rest settled (a receipt repeated in a later frame is stale
        there, as it would be settled after the first)."""
        start = 0
        stale = result.stale
        for ack in carried:
            receipts = ack.args.receipts
            end = start + len(receipts)
            mine = [receipts[p - start] for p in stale if start <= p < end]
            await self.link.send(
                {
                    "op": "settled",
                    "of": "ack",
                    "settled": len(receipts) - len(mine),
                    "stale": mine,
                    **ack.about,
                }
            )
            start = end

    async def _settle_apart(self) -> None:
        """Settle the acks left to carry each by itself, as if never carried."""
        carried, self.carried, self.carried_receipts = self.carried, [], 0
        for ack in carried:
            await self._spawn_settle("ack", ack.args, ack.about)

    async def settle_carried(self) -> None:
        """Settle acks left to carry when the connection closed (the consumer stopped
        before it took them); nobody is left to answer."""
        carried, self.carried, self.carried_receipts = self.carried, [], 0
        if carried:
            try:
                await self.node.ack(self.name, [r for a in carried for r in a.args.receipts])
            except QuorraError as e:
                log.warning("stream on %s: acks not settled at close: %s", self.name, e)

    async def return_leases(self) -> None:
        """Give back what was delivered here and not settled: at once, not at lease end."""
        receipts, self.outstanding = list(self.outstanding), {}
        await self._give_back(receipts)

    async def _give_back(self, receipts: list[str]) -> None:
        step = self.limits.receive_messages_max
        for start in range(0, len(receipts), step):
            try:
                await self.node.nack(self.name, receipts[start : start + step], requeue=True)
            except QuorraError as e:
                # Not returned now: the leases end by themselves (lease_ms) instead.
                log.warning("stream on %s: leases not returned at close: %s", self.name, e)


def _seal_of(receipts: list[str]) -> ReceiptSeal | None:
    """The seal that made a delivery's receipts (None for a batch from a peer)."""
    return receipts.seal if type(receipts) is SealedReceipts else None


def _joined(lists: list[list[str]]) -> list[str]:
    """The receipts of several acks in one list: ``SealedReceipts`` when each list was,
    all of one seal."""
    if len(lists) == 1:
        return lists[0]
    joined = [r for receipts in lists for r in receipts]
    seals = {_seal_of(receipts) for receipts in lists}
    if len(seals) == 1 and (seal := seals.pop()) is not None:
        return SealedReceipts(joined, seal)
    return joined


def _is_text(value: str) -> bool:
    """MessagePack text may carry lone surrogates, which are no UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


__all__ = ["CONSUME_KEYS", "CarriedAck", "StreamConsumer", "settle_frame"]
