"""The client operations on one queue's messages: publish, receive, settle (ack, nack,
extend), browse and purge.

Rule: each operation is checked against the limits on the node that takes it, admitted
(``NodeContext.admit``) and routed to the node of the queue's leader (``routing``); the
``*_local`` half runs there, on a replica that leads, and proposes one command. A
message is checked once, where its batch is encoded; a receipt's MAC is checked on the
leader before anything is proposed. Message bodies are read from the log (``entry``),
never copied into the machine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from engine.errors import (
    Backpressure,
    EntryDamaged,
    MessageTooLarge,
    NoLeader,
    StorageFailed,
    ValidationFailed,
    WireError,
)
from engine.limits import Limits
from engine.queue import (
    CheckedOut,
    Enqueued,
    KeyedBody,
    NewMessage,
    Purged,
    Settled,
    SettledCheckedOut,
    check_receipt_texts,
    encode_checkout,
    encode_discard,
    encode_enqueue,
    encode_extend,
    encode_purge,
    encode_return,
    encode_settle,
    encode_settle_checkout,
    enqueue_bytes,
    message_id,
    message_run,
    read_message,
)
from engine.raft.entry import Entry
from engine.raft.server import Role
from engine.runtime.api import (
    BrowsedMessage,
    OutgoingMessage,
    PublishItem,
    ReceivedBatch,
    SettleResult,
    outgoing,
)
from engine.runtime.meta import (
    CONSUMER_BYTES_MAX,
    DEDUP_ID_BYTES_MAX,
    check_message,
    decode_headers,
)
from engine.runtime.publish_groups import PublishGroups
from engine.runtime.replica import Replica
from engine.runtime.routing import (
    BrowseCall,
    LeaderCall,
    PublishCall,
    PurgeCall,
    ReceiveCall,
    SettleCall,
    SettleHow,
)

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


class QueueOps:
    """A node's message operations, both the checking side and the leader's side."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.groups = PublishGroups(ctx)

    def check(self, call: LeaderCall) -> None:
        """A client operation's arguments checked against the limits: by the node that
        takes it, and again by the leader's node when a peer forwarded it (the leader's
        half trusts them). Each message is checked once, where the batch is encoded."""
        limits = self.ctx.limits
        if isinstance(call, PublishCall):
            _check_publish(len(call.messages), limits)
        elif isinstance(call, ReceiveCall):
            _check_receive(call, limits)
        elif isinstance(call, SettleCall):
            _check_settle(call, limits)
        elif isinstance(call, BrowseCall):
            if not 1 <= call.limit <= limits.receive_messages_max:
                raise ValidationFailed(f"limit must be 1..{limits.receive_messages_max}")
            if call.after is not None and call.after < 0:
                raise ValidationFailed("after must be a cursor from an earlier page")

    async def publish(
        self,
        name: str,
        messages: Sequence[PublishItem],
        on_durable: Callable[[], None] | None = None,
    ) -> list[int]:
        """``QueueEngine.publish``: ``on_durable`` runs only when led here."""
        ctx = self.ctx
        rep = ctx.replicas.get(name)
        if rep is None:  # a replica here is known: ``check_known`` would pass it
            ctx.router.check_known(name)
        _check_publish(len(messages), ctx.limits)  # what ``check`` checks of a PublishCall
        with ctx.admit():
            if rep is not None and rep.raft.role is Role.LEADER:
                # Led here (always, on a single node): ``route`` would find the same.
                return await self.publish_local(rep, messages, on_durable)
            # A call crosses the wire with whole messages (engine/runtime/wire.py).
            whole = [outgoing(m) for m in messages]
            result = await ctx.router.route(PublishCall(name, whole))
        assert isinstance(result, list)
        return result

    async def publish_local(
        self,
        rep: Replica,
        messages: Sequence[PublishItem],
        on_durable: Callable[[], None] | None = None,
    ) -> list[int]:
        limits = self.ctx.limits
        batch = self.new_messages(rep, messages)
        groups = self.groups
        command = None
        if on_durable is None and groups.may_join(rep, len(batch)):
            size = enqueue_bytes(batch)
        else:
            command = encode_enqueue(batch)
            size = len(command)
        if size > limits.batch_bytes_max:
            raise MessageTooLarge(f"a batch is at most {limits.batch_bytes_max} bytes")
        if rep.inflight_publish_bytes + size > limits.inflight_publish_bytes_per_queue_max:
            raise Backpressure(f"queue {rep.name}: too many publish bytes in flight")
        self.ctx.memory.check_publish(size)
        rep.inflight_publish_bytes += size
        try:
            joined = None if command is not None else groups.join(rep, batch, size)
            if joined is not None:
                return await joined
            on_applied = None if on_durable is None else _calling(on_durable)
            reply = await self.ctx.propose(rep, command or encode_enqueue(batch), on_applied)
        finally:
            rep.inflight_publish_bytes -= size
        assert isinstance(reply, Enqueued), reply
        return list(reply.ids)

    def new_messages(
        self, rep: Replica, messages: Sequence[PublishItem]
    ) -> list[NewMessage | bytes | KeyedBody]:
        """The batch to encode, each message checked. A message given as its body alone
        (``bytes``) or as its dedup id and body (``KeyedItem``), or an ``OutgoingMessage``
        with a ``bytes`` body and every other field (but the dedup id) at its default
        (most of them), needs only its sizes checked, and is encoded from its body (and
        id) alone; the others go through ``check_message``."""
        policy = rep.machine.policy
        body_bytes_max = policy.max_message_bytes
        batch: list[NewMessage | bytes | KeyedBody] = []
        framed = False
        for m in messages:
            if type(m) is OutgoingMessage and _body_and_id_alone(m):
                m = m.body if m.dedup_id is None else (m.dedup_id, m.body)
            if type(m) is bytes:
                if len(m) > body_bytes_max:  # the usual message: no call when it fits
                    _sized(m, body_bytes_max)
                batch.append(m)
                continue
            if type(m) is tuple and type(m[0]) is str and type(m[1]) is bytes:
                batch.append(_keyed(m[0], m[1], body_bytes_max))
                continue
            m = outgoing(m)
            framed = framed or m.frame_count != 0
            batch.append(
                NewMessage(
                    bytes(m.body),
                    check_message(m, policy, self.ctx.limits),
                    min(m.priority, 255),
                    m.ttl_ms,
                    m.delay_ms,
                    None if m.dedup_id is None else m.dedup_id.encode(),
                    m.frame_count,
                )
            )
        if framed:
            _check_frames(batch)
        return batch

    async def receive(
        self,
        name: str,
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
        ack: list[str],
    ) -> ReceivedBatch:
        ctx = self.ctx
        ctx.router.check_known(name)
        call = ReceiveCall(name, consumer, max_messages, wait_ms, lease_ms, ack)
        self.check(call)
        with ctx.admit():
            rep = ctx.replicas.get(name)
            if rep is not None and rep.raft.role is Role.LEADER:
                # Led here (always, on a single node), as ``publish``: ``route`` would
                # find the same, and a batch made here needs no check of its lists.
                return await self.receive_local(rep, consumer, max_messages, wait_ms, lease_ms, ack)
            result = await ctx.router.route(call)
        assert isinstance(result, ReceivedBatch)
        if not result.consistent():
            raise WireError(f"queue {name}: a receive's answer whose lists differ in length")
        return result

    async def receive_local(
        self,
        rep: Replica,
        consumer: str,
        max_messages: int,
        wait_ms: int,
        lease_ms: int | None,
        ack: list[str],
    ) -> ReceivedBatch:
        """The first proposal settles ``ack`` and checks out in one entry; while nothing
        is ready and ``wait_ms`` allows, later ones only check out. Once acks settled,
        the answer says so even if leadership moved during the wait (no messages then),
        so that a client does not take its settled acks for lost and retry them (they
        would be reported stale)."""
        ctx = self.ctx
        loop = ctx.loop
        deadline = loop.time() + wait_ms / 1000
        opened = rep.seal.open_many(ack) if ack else []
        pairs = [p for p in opened if p is not None]
        checkout = encode_checkout(consumer, max_messages, lease_ms or 0)
        command = (
            encode_settle_checkout(pairs, consumer, max_messages, lease_ms or 0)
            if pairs
            else checkout
        )
        settled = SettleResult(0, tuple(range(len(ack))))
        batch: ReceivedBatch | None = None
        while True:
            try:
                result = await ctx.propose(rep, command, lambda r: self.deliveries(rep, r))
            except NoLeader:
                if batch is None or not pairs:
                    raise
                return _with_settled(batch, settled)  # the acks did settle
            assert isinstance(result, tuple)
            batch, seq, settle_reply = result
            assert isinstance(batch, ReceivedBatch)
            if settle_reply is not None:
                settled = _settle_result(opened, settle_reply)
            command = checkout
            remaining = deadline - loop.time()
            if batch.ids or remaining <= 0:
                return _with_settled(batch, settled)
            while rep.available_seq <= seq and not rep.closed and not ctx.stopping:
                waiter: asyncio.Future[None] = loop.create_future()
                rep.own_available_waiters().append(waiter)
                try:
                    await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return _with_settled(batch, settled)
            if ctx.stopping:
                return _with_settled(batch, settled)
            if rep.raft.role is not Role.LEADER:
                if pairs:
                    return _with_settled(batch, settled)
                raise NoLeader(f"queue {rep.name}: leadership moved, retry")

    def deliveries(self, rep: Replica, reply: object) -> tuple[ReceivedBatch, int, Settled | None]:
        """Runs as the checkout (or settle-checkout) applies: read the leased messages
        from the log, a run of entries at a time, and each run of consecutive messages
        of one entry from one parse of its records. (The batch, without its settle
        result; the replica's availability count; the settle's reply.)"""
        settled: Settled | None = None
        if isinstance(reply, SettledCheckedOut):
            settled, reply = reply.settled, reply.checked_out
        assert isinstance(reply, CheckedOut), reply
        runs = rep.machine.slot_runs(reply.refs)
        entries = self.entries(rep, sorted({index for index, _first, _count in runs}))
        ids: list[int] = []
        bodies: list[bytes] = []
        headers: list[dict[str, str]] = []
        published: list[int] = []
        for index, first, count in runs:
            entry = entries[index]
            run_bodies, run_headers = message_run(entry.data, first, count)
            bodies += run_bodies
            headers += (
                [{} for _ in run_bodies]
                if run_headers is None
                else [decode_headers(raw) if raw else {} for raw in run_headers]
            )
            start = message_id(index, first)
            ids += range(start, start + count)
            published += [entry.now_ms] * count
        batch = ReceivedBatch(
            _NOTHING_SETTLED,
            ids,
            rep.seal.seal_many(reply.tags, reply.refs),
            bodies,
            headers,
            list(reply.priorities),
            list(reply.delivery_counts),
            published,
            reply.lease_expires_ms,
        )
        return batch, rep.available_seq, settled

    def entry(self, rep: Replica, index: int) -> Entry:
        return self.entries(rep, [index])[index]

    def entries(self, rep: Replica, indexes: list[int]) -> dict[int, Entry]:
        """The entries at ``indexes`` (ascending, distinct) by index: those of an
        installed snapshot, the others from the log, a run of consecutive indexes per
        read (``ServerLog.read_many``), not one read per entry."""
        installed = rep.installed_live
        found = {i: installed[i] for i in indexes if i in installed} if installed else {}
        wanted = [i for i in indexes if i not in found] if found else indexes
        try:
            for entry in rep.log.read_many(wanted, self.ctx.limits.read_run_bytes_max):
                found[entry.index] = entry
        except LookupError as e:
            raise StorageFailed(f"queue {rep.name}: {e}") from e
        except EntryDamaged as e:
            # With peers, the replica stops (a leader steps down) and is repaired at the
            # next start; the message, leased to nobody who got it, is delivered again by
            # the next leader once the lease ends. A lone member only fails this read.
            if len(rep.meta.members) > 1:
                self.ctx.hosting.damaged(rep, e)
            raise
        return found

    async def ack(self, name: str, receipts: list[str]) -> SettleResult:
        return await self.settle(name, "ack", receipts, 0)

    async def nack(self, name: str, receipts: list[str], requeue: bool) -> SettleResult:
        return await self.settle(name, "nack" if requeue else "discard", receipts, 0)

    async def extend(self, name: str, receipts: list[str], lease_ms: int) -> SettleResult:
        return await self.settle(name, "extend", receipts, lease_ms)

    async def settle(
        self, name: str, how: SettleHow, receipts: list[str], lease_ms: int
    ) -> SettleResult:
        ctx = self.ctx
        ctx.router.check_known(name)
        call = SettleCall(name, how, receipts, lease_ms)
        self.check(call)
        if not receipts:
            return SettleResult(0, ())
        with ctx.admit():
            result = await ctx.router.route(call)
        assert isinstance(result, SettleResult)
        return result

    async def settle_local(
        self, rep: Replica, how: SettleHow, receipts: list[str], lease_ms: int
    ) -> SettleResult:
        """Check each receipt's MAC here, on the leader, before anything is proposed: a
        receipt this queue did not make (forged, altered, another queue's) is reported
        stale without reaching the machine, as a receipt whose lease ended. Each node
        seals with its own key (engine/node_key.py): after leadership moves, the old
        leader's receipts are stale (their messages are delivered again when the leases
        end) until the nodes of a cluster share one secret."""
        opened = rep.seal.open_many(receipts)
        pairs = [p for p in opened if p is not None]
        if not pairs:
            return SettleResult(0, tuple(range(len(receipts))))
        if how == "ack":
            command = encode_settle(pairs)
        elif how == "nack":
            command = encode_return(pairs)
        elif how == "discard":
            command = encode_discard(pairs)
        else:
            command = encode_extend(pairs, lease_ms)
        reply = await self.ctx.propose(rep, command)
        assert isinstance(reply, Settled), reply
        return _settle_result(opened, reply)

    async def browse(self, name: str, after: int | None, limit: int) -> list[BrowsedMessage]:
        ctx = self.ctx
        ctx.router.check_known(name)
        call = BrowseCall(name, after, limit)
        self.check(call)
        async with ctx.admit():
            result = await ctx.router.route(call)
        assert isinstance(result, list)
        return result

    def browse_local(self, rep: Replica, after: int | None, limit: int) -> list[BrowsedMessage]:
        out = []
        for item in rep.machine.browse(after, limit):
            parts = rep.machine.ref_parts(item.ref)
            index, slot = parts.index, parts.slot
            entry = self.entry(rep, index)
            view = read_message(entry.data, slot)
            out.append(
                BrowsedMessage(
                    id=message_id(index, slot),
                    cursor=item.cursor,
                    body=bytes(view.body),
                    headers=decode_headers(view.headers),
                    priority=item.priority,
                    delivery_count=item.delivery_count,
                    published_at_ms=entry.now_ms,
                )
            )
        return out

    async def purge(self, name: str) -> int:
        ctx = self.ctx
        async with ctx.admit():
            result = await ctx.router.route(PurgeCall(name))
        assert isinstance(result, int)
        return result

    async def purge_local(self, rep: Replica) -> int:
        reply = await self.ctx.propose(rep, encode_purge())
        assert isinstance(reply, Purged)
        return reply.count


_NOTHING_SETTLED = SettleResult(0, ())


def _settle_result(opened: list[tuple[int, int] | None], reply: Settled) -> SettleResult:
    """The answer to receipts ``opened`` by the seal, of which those not ``None`` were
    proposed and answered by ``reply``: the others are stale too, in their places."""
    if all(p is not None for p in opened):
        return SettleResult(reply.count, reply.stale)
    sent = [i for i, p in enumerate(opened) if p is not None]
    refused = [i for i, p in enumerate(opened) if p is None]
    return SettleResult(reply.count, tuple(sorted(refused + [sent[k] for k in reply.stale])))


def _check_receive(call: ReceiveCall, limits: Limits) -> None:
    if not 1 <= len(call.consumer.encode()) <= CONSUMER_BYTES_MAX:
        raise ValidationFailed(f"consumer is 1..{CONSUMER_BYTES_MAX} bytes")
    if not 1 <= call.max_messages <= limits.receive_messages_max:
        raise ValidationFailed(f"max_messages must be 1..{limits.receive_messages_max}")
    if not 0 <= call.wait_ms <= limits.receive_wait_ms_max:
        raise ValidationFailed(f"wait_ms must be 0..{limits.receive_wait_ms_max}")
    if call.lease_ms is not None and not 1 <= call.lease_ms <= limits.lease_ms_max:
        raise ValidationFailed(f"lease_ms must be 1..{limits.lease_ms_max}")
    _check_receipts(call.ack, limits)


def _check_settle(call: SettleCall, limits: Limits) -> None:
    if call.how == "extend" and not 1 <= call.lease_ms <= limits.lease_ms_max:
        raise ValidationFailed(f"lease_ms must be 1..{limits.lease_ms_max}")
    _check_receipts(call.receipts, limits)


def _check_receipts(receipts: list[str], limits: Limits) -> None:
    if len(receipts) > limits.receive_messages_max:
        raise ValidationFailed(f"at most {limits.receive_messages_max} receipts")
    check_receipt_texts(receipts)


def _body_and_id_alone(m: OutgoingMessage) -> bool:
    """Whether ``m`` is a ``bytes`` body (and a dedup id) with every other field at
    its default: encoded as its body alone or as a ``KeyedBody``."""
    return (
        type(m.body) is bytes
        and m.headers == {}
        and type(m.priority) is int
        and m.priority == 0
        and m.ttl_ms is None
        and type(m.delay_ms) is int
        and m.delay_ms == 0
        and (m.dedup_id is None or type(m.dedup_id) is str)
        and m.frame_count == 0
    )


def _check_frames(batch: Sequence[NewMessage | bytes | KeyedBody]) -> None:
    """A frame (``OutgoingMessage.frame_count``) lies within its batch and over messages
    without a dedup id of their own; ``ValidationFailed`` otherwise."""
    inside = 0
    for k, m in enumerate(batch):
        count = m.frame_count if type(m) is NewMessage else 0
        own = type(m) is tuple or (type(m) is NewMessage and m.dedup_id is not None)
        if inside:
            inside -= 1
            if own:
                raise ValidationFailed(
                    f"messages[{k}]: a message of a frame with a dedup_id has none of its own"
                )
            continue
        if count:
            if count > len(batch) - k:
                raise ValidationFailed(f"messages[{k}]: its frame runs past the batch")
            inside = count - 1


def _sized(body: bytes, body_bytes_max: int) -> bytes:
    """``body``, refused when larger than the queue's messages may be."""
    if len(body) > body_bytes_max:
        raise MessageTooLarge(f"a message is larger than {body_bytes_max} bytes")
    return body


def _keyed(dedup_id: str, body: bytes, body_bytes_max: int) -> KeyedBody:
    """A message of a dedup id and a body, checked as ``check_message`` would."""
    _sized(body, body_bytes_max)
    dedup = dedup_id.encode()
    if not 1 <= len(dedup) <= DEDUP_ID_BYTES_MAX:
        raise ValidationFailed(f"dedup_id must be 1..{DEDUP_ID_BYTES_MAX} bytes")
    return dedup, body


def _check_publish(messages: int, limits: Limits) -> None:
    if not messages:
        raise ValidationFailed("a publish holds at least one message")
    if messages > limits.batch_messages_max:
        raise MessageTooLarge(f"a batch holds at most {limits.batch_messages_max}")


def _with_settled(batch: ReceivedBatch, settled: SettleResult) -> ReceivedBatch:
    """``batch`` saying ``settled``: itself when it says so already (a receive without
    acks, most of them), as ``dataclasses.replace`` is slow for a step of every receive."""
    return batch if batch.settled == settled else replace(batch, settled=settled)


def _calling(on_durable: Callable[[], None]) -> Callable[[object], object]:
    """A proposal's ``on_applied`` that calls ``on_durable`` and keeps the reply. Only a
    reply that is no rejection reaches it (``Effects.resolve``): the batch is applied."""

    def on_applied(reply: object) -> object:
        on_durable()
        return reply

    return on_applied


__all__ = ["QueueOps"]
