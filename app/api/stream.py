"""``GET /api/v1/queues/{name}/stream``: publish and consume on one WebSocket.

The handshake carries the bearer token as every REST call does (``Authorization:
Bearer``); a refused one is answered as REST would, with an HTTP problem instead of the
upgrade (401 bad token, 403 neither write nor read on the queue, 404 no such queue, 422
a bad name, 503 no engine). Then each WebSocket message is one binary MessagePack map, a
*frame*, with an ``op`` (the frame format is in README.md, "Streams", and the OpenAPI
description).

Rules:

- A publish frame is confirmed only once its messages are durable on a quorum (once
  ``node.publish`` returned). Frames are published in the order they arrive, several at
  once when they queue up behind a publish in flight (one engine batch, one Raft
  command), and every frame gets exactly one answer: a ``confirm`` (cumulative: every
  publish up to that ``seq`` without an ``error`` frame of its own) or an ``error``. A
  merged batch the engine refuses whole is published again frame by frame, so that one
  bad frame never fails its neighbours.
- The window: at ``stream_unconfirmed_messages_max`` messages (or ``..._bytes_max``
  bytes) unconfirmed, the server stops reading the socket until confirms free room; the
  WebSocket protocol under it reads nothing more (uvicorn's websockets-sansio), so TCP
  pushes back on the client. Memory per connection is bounded by the window plus one
  frame, whatever the client sends.
- Consuming: ``consume`` sets the prefetch credit; the server keeps at most that many
  messages delivered and not yet acked or nacked on the connection, pushing more as they
  arrive. ``ack``/``nack``/``extend`` settle receipts as the REST endpoints do. Acks
  that come while the consumer waits for the credit they give ride on its next receive
  (one Raft entry settles them and leases the next batch, as a REST receive carrying
  ``ack``); each ack frame is still answered by itself, as if settled alone.
- A frame that is no MessagePack map, names no known ``op`` or fails validation is
  answered with an ``error`` frame (the problem type, as REST) and changes nothing; the
  connection stays open.
- A closed connection returns its leases at once (nack with requeue: delivered again
  with ``delivery_count`` + 1). A receive in flight when it closes is never cancelled
  (its checkout may already be applied): what it leases is returned as soon as it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import msgpack
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import State
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.api import message_bodies
from app.api.deps import API_PREFIX, bearer_principal
from app.api.queue_schemas import CONSUMER_CHARS_MAX
from app.auth import Principal
from app.frame_packing import FramePacker
from app.names import check_queue_name
from app.negotiation import unpackb
from app.problems import AppProblem, Forbidden, typed_problem
from app.state import frame_packer_of, node_or_none, settings_of
from engine.errors import InvalidRequest, NoLeader, QueueNotFound, QuorraError, ValidationFailed
from engine.limits import Limits
from engine.runtime.api import OutgoingMessage, QueueEngine, ReceivedBatch, SettleResult

log = logging.getLogger("quorra.app")

STREAM_PATH = f"{API_PREFIX}/queues/{{name}}/stream"
PUBLISH_KEYS = frozenset({"op", "seq", "messages"})
CONSUME_KEYS = frozenset({"op", "prefetch", "lease_ms", "consumer"})
SEQ_MAX = (1 << 63) - 1
RETRY_S_DEFAULT = 1.0
"""How long a consumer waits after an engine error without a ``Retry-After``."""


OPENAPI_DESCRIPTION = """\
Publish and consume over REST (the paths below) or over a **stream**: one WebSocket per
client and queue, `GET /api/v1/queues/{name}/stream`, which OpenAPI cannot describe.

The handshake carries `Authorization: Bearer <token>`; a refused one gets the problem
as HTTP instead of the upgrade (401; 403 without `write` or `read` on the queue; 404;
422 for a bad name). Each WebSocket message is then one binary MessagePack map whose
`op` names it:

| from | frame |
|---|---|
| server | `ready`: `window_messages`, `window_bytes`, `prefetch_max`, `batch_messages_max` (first) |
| client | `publish`: `seq` (above the last), `messages` (as a publish body, bodies as bytes); needs `write` |
| server | `confirm`: `seq`; every publish up to it without its own `error` is durable on a quorum |
| client | `consume`: `prefetch` (0 pauses), `lease_ms`, `consumer`; needs `read` |
| server | `deliver`: `messages` (`id`, `receipt`, `body`, `headers`, `priority`, `delivery_count`, `published_at_ms`, `lease_expires_at_ms`) |
| client | `ack`, `nack` (`requeue`), `extend` (`lease_ms`): `receipts`, `ref`; ack and nack give credit back |
| server | `settled`: `of`, `settled`, `stale`, `ref` |
| server | `error`: `type`, `title`, `status`, `detail` (RFC 9457), `of`, `seq` or `ref` |

At most `window_messages` publishes unconfirmed: the server then stops reading the
socket until confirms free room. At most `prefetch` deliveries unsettled. A bad frame
gets an `error` frame and changes nothing. A closed socket's leases return at once
(delivered again with `delivery_count` + 1). The Python client is `quorra.client`.
"""


class FrameError(Exception):
    """A frame refused before it changed anything: answered with an error frame."""

    def __init__(self, problem: QuorraError | AppProblem, **about: object) -> None:
        super().__init__(problem.detail)
        self.problem = problem
        self.about = about


def error_frame(problem: QuorraError | AppProblem, **about: object) -> dict[str, object]:
    """The ``error`` frame of a problem: its RFC 9457 fields, and what it answers."""
    frame: dict[str, object] = {
        "op": "error",
        "type": problem.problem_type,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
    }
    if problem.retry_after_s is not None:
        frame["retry_after_s"] = problem.retry_after_s
    frame.update(about)
    return frame


def _refusal(e: Exception) -> QuorraError:
    """A refused frame's error: the schema's errors (app/api/message_bodies.py) in one
    ``ValidationFailed``, or the parser's own typed error."""
    if isinstance(e, QuorraError):
        return e
    assert isinstance(e, RequestValidationError)
    errors = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'][1:])}: {err['msg']}" for err in e.errors()
    )
    return ValidationFailed(errors or "invalid frame")


@dataclass(frozen=True, slots=True)
class CarriedAck:
    """An ack frame whose receipts the consumer's next receive settles."""

    args: message_bodies.SettleArgs
    about: dict[str, object]
    """Its ``ref``, echoed in the answer."""


@dataclass(frozen=True, slots=True)
class PendingPublish:
    seq: int
    messages: list[OutgoingMessage]
    body_bytes: int


def publish_frame(frame: dict[str, Any], last_seq: int, limits: Limits) -> PendingPublish:
    """A publish frame's messages, checked as ``POST .../messages`` checks a batch;
    ``FrameError`` (naming the ``seq`` when it is one) otherwise."""
    seq = frame.get("seq")
    if type(seq) is not int or not last_seq < seq <= SEQ_MAX:
        raise FrameError(
            ValidationFailed(f"seq must be an integer above the last one ({last_seq})"),
            of="publish",
        )
    if not PUBLISH_KEYS.issuperset(frame):
        unknown = sorted(str(k) for k in frame if k not in PUBLISH_KEYS)
        raise FrameError(ValidationFailed(f"unknown fields {unknown}"), of="publish", seq=seq)
    payload = {"messages": frame.get("messages")}
    try:
        messages = message_bodies.publish_messages(payload, limits)
    except (RequestValidationError, QuorraError) as e:
        raise FrameError(_refusal(e), of="publish", seq=seq) from None
    return PendingPublish(seq, messages, sum(len(m.body) for m in messages))


def settle_frame(how: str, frame: dict[str, Any]) -> message_bodies.SettleArgs:
    payload = {k: v for k, v in frame.items() if k not in ("op", "ref")}
    try:
        return message_bodies.settle_args(how, payload)
    except (RequestValidationError, QuorraError) as e:
        raise FrameError(_refusal(e), of=how, **_ref(frame)) from None


def _ref(frame: dict[str, Any]) -> dict[str, object]:
    """The client's ``ref`` of a settle frame, echoed in its answer."""
    ref = frame.get("ref")
    return {"ref": ref} if type(ref) in (int, str) else {}


class StreamConnection:
    """One accepted stream: a reader (this task), a publisher and a consumer task."""

    def __init__(
        self,
        websocket: WebSocket,
        node: QueueEngine,
        name: str,
        who: Principal,
        limits: Limits,
        packer: FramePacker,
    ) -> None:
        self.ws, self.node, self.name, self.who, self.limits = websocket, node, name, who, limits
        self.packer = packer
        self.closed = False
        # publishing: frames read and not yet answered, oldest first
        self.pending: deque[PendingPublish] = deque()
        self.last_seq = -1
        self.unconfirmed_messages = 0
        self.unconfirmed_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self.work = asyncio.Event()
        # consuming: receipts delivered here and not yet acked or nacked
        self.prefetch = 0
        self.lease_ms: int | None = None
        self.consumer = who.token_id or who.name
        self.outstanding: dict[str, None] = {}
        self.credit = asyncio.Event()
        self.settle_slots = asyncio.Semaphore(limits.stream_settles_inflight_max)
        self.settles: set[asyncio.Task[None]] = set()
        # acks for the consumer's next receive to carry (one Raft entry settles them and
        # leases the next batch): taken only while it waits for the credit they give
        self.carried: list[CarriedAck] = []
        self.carried_receipts = 0
        self.waiting_credit = False

    # --- the connection's life --------------------------------------------------------

    async def run(self) -> None:
        limits = self.limits
        await self.send(
            {
                "op": "ready",
                "window_messages": limits.stream_unconfirmed_messages_max,
                "window_bytes": limits.stream_unconfirmed_bytes_max,
                "prefetch_max": limits.stream_prefetch_max,
                "batch_messages_max": limits.batch_messages_max,
            }
        )
        loop = asyncio.get_running_loop()
        publisher = loop.create_task(self.guarded(self.publish_loop()))
        consumer = loop.create_task(self.guarded(self.consume_loop()))
        try:
            await self.read_loop()
        finally:
            self.closed = True
            self.work.set()
            self.credit.set()
            self.room.set()
            # None of these is cancelled: a publish or checkout in flight may already be
            # applied, and what it did must be answered (or its leases returned).
            await asyncio.gather(publisher, consumer, *self.settles, return_exceptions=True)
            await self.settle_carried()
            await self.return_leases()

    async def guarded(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a loop of the connection; should it fail unexpectedly (a bug), close the
        connection (1011) rather than leave the reader waiting for room that no confirm
        will free."""
        try:
            await work
        except Exception:
            log.exception("stream on %s failed; closing it", self.name)
            self.closed = True
            self.work.set()
            self.credit.set()
            self.room.set()
            with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                await self.ws.close(1011)

    async def send(self, frame: dict[str, object]) -> None:
        """Send one frame; a connection gone meanwhile only marks it closed."""
        await self.send_packed(msgpack.packb(frame, use_bin_type=True))

    async def send_packed(self, frame: bytes) -> None:
        """``send`` of a frame already packed."""
        if self.closed:
            return
        try:
            await self.ws.send_bytes(frame)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True
            self.work.set()
            self.credit.set()
            self.room.set()

    async def read_loop(self) -> None:
        limits = self.limits
        while not self.closed:
            # The window: no frame is read while it is full.
            while not self.closed and (
                self.unconfirmed_messages >= limits.stream_unconfirmed_messages_max
                or self.unconfirmed_bytes >= limits.stream_unconfirmed_bytes_max
            ):
                self.room.clear()
                await self.room.wait()
            if self.closed:
                return
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            try:
                if data is None:
                    raise FrameError(InvalidRequest("frames are binary MessagePack maps"))
                await self.on_frame(data)
            except FrameError as e:
                await self.send(error_frame(e.problem, **e.about))

    async def on_frame(self, data: bytes) -> None:
        try:
            frame = unpackb(data)
        except InvalidRequest as e:
            raise FrameError(e) from None
        if type(frame) is not dict or type(frame.get("op")) is not str:
            raise FrameError(InvalidRequest("a frame is a MessagePack map with an 'op'"))
        op = frame["op"]
        if op == "publish":
            self.on_publish(frame)
        elif op == "consume":
            self.on_consume(frame)
        elif op in message_bodies.SETTLE_MODELS:
            await self.on_settle(op, frame)
        else:
            raise FrameError(
                InvalidRequest(f"unknown op {op[:40]!r}: publish, consume, ack, nack or extend")
            )

    # --- publishing -------------------------------------------------------------------

    def on_publish(self, frame: dict[str, Any]) -> None:
        seq = frame.get("seq")
        about = {"seq": seq} if type(seq) is int else {}
        if not self.who.can("write", self.name):
            raise FrameError(self._forbidden("write"), of="publish", **about)
        publish = publish_frame(frame, self.last_seq, self.limits)
        self.last_seq = publish.seq
        self.pending.append(publish)
        self.unconfirmed_messages += len(publish.messages)
        self.unconfirmed_bytes += publish.body_bytes
        self.work.set()

    async def publish_loop(self) -> None:
        while True:
            while not self.pending and not self.closed:
                self.work.clear()
                await self.work.wait()
            if self.closed:
                return  # frames never published: unconfirmed, so the client retries them
            frames = self._take_batch()
            outcomes = await self._publish(frames)
            self.unconfirmed_messages -= sum(len(f.messages) for f in frames)
            self.unconfirmed_bytes -= sum(f.body_bytes for f in frames)
            self.room.set()
            await self._answer(frames, outcomes)

    def _take_batch(self) -> list[PendingPublish]:
        """The oldest frames that fit one engine batch (at least one)."""
        limits = self.limits
        frames = [self.pending.popleft()]
        count, size = len(frames[0].messages), frames[0].body_bytes
        while self.pending:
            nxt = self.pending[0]
            if (
                count + len(nxt.messages) > limits.batch_messages_max
                or size + nxt.body_bytes > limits.batch_bytes_max
            ):
                break
            frames.append(self.pending.popleft())
            count += len(nxt.messages)
            size += nxt.body_bytes
        return frames

    async def _publish(self, frames: list[PendingPublish]) -> list[QuorraError | None]:
        """Each frame's outcome: None once durable, else the error it was refused with."""
        messages = (
            frames[0].messages if len(frames) == 1 else [m for f in frames for m in f.messages]
        )
        try:
            await self.node.publish(self.name, messages)
        except QuorraError as e:
            # A refusal of the merged batch (4xx) may be one frame's: each alone then.
            # An error of the server or its quorum (5xx) is every frame's, as it is.
            if len(frames) == 1 or e.status >= 500:
                return [e] * len(frames)
            return [await self._publish_one(f) for f in frames]
        return [None] * len(frames)

    async def _publish_one(self, frame: PendingPublish) -> QuorraError | None:
        try:
            await self.node.publish(self.name, frame.messages)
        except QuorraError as e:
            return e
        return None

    async def _answer(
        self, frames: list[PendingPublish], outcomes: list[QuorraError | None]
    ) -> None:
        confirmed: int | None = None
        for frame, outcome in zip(frames, outcomes, strict=True):
            if outcome is None:
                confirmed = frame.seq
                continue
            if confirmed is not None:
                await self.send({"op": "confirm", "seq": confirmed})
                confirmed = None
            await self.send(error_frame(outcome, of="publish", seq=frame.seq))
        if confirmed is not None:
            await self.send({"op": "confirm", "seq": confirmed})

    # --- consuming --------------------------------------------------------------------

    def on_consume(self, frame: dict[str, Any]) -> None:
        if not self.who.can("read", self.name):
            raise FrameError(self._forbidden("read"), of="consume")
        limits = self.limits
        prefetch, lease_ms = frame.get("prefetch"), frame.get("lease_ms")
        consumer = frame.get("consumer")
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
        self.prefetch, self.lease_ms = prefetch, lease_ms
        if consumer is not None:
            self.consumer = consumer
        self.credit.set()

    async def consume_loop(self) -> None:
        limits = self.limits
        while not self.closed:
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
                    ack=[r for ack in carried for r in ack.args.receipts],
                    consumer=self.consumer,
                    max_messages=min(room, limits.receive_messages_max),
                    # carried acks are answered now, not after a long poll
                    wait_ms=0 if carried else limits.stream_receive_wait_ms,
                    lease_ms=self.lease_ms,
                )
            except QuorraError as e:
                for ack in carried:
                    await self.send(error_frame(e, of="ack", **ack.about))
                await self._consume_failed(e)
                continue
            await self._answer_carried(carried, batch.settled)
            if self.closed:
                await self._give_back(batch.receipts)
                return
            if batch.ids:
                self.outstanding.update(dict.fromkeys(batch.receipts))
                await self.send_packed(deliver_frame(batch, self.packer))

    async def _consume_failed(self, e: QuorraError) -> None:
        """Tell the client; wait and try again after a passing error (no leader, full),
        stop consuming after a lasting one (the queue is gone) until asked again."""
        await self.send(error_frame(e, of="consume"))
        if e.status < 500 and e.status != 429:
            self.prefetch = 0
            return
        delay_s = e.retry_after_s if e.retry_after_s is not None else RETRY_S_DEFAULT
        with contextlib.suppress(TimeoutError):
            self.credit.clear()
            await asyncio.wait_for(self.credit.wait(), delay_s)

    async def on_settle(self, how: str, frame: dict[str, Any]) -> None:
        if not self.who.can("read", self.name):
            raise FrameError(self._forbidden("read"), of=how, **_ref(frame))
        args = settle_frame(how, frame)
        if how != "extend":  # settled or stale: either way no longer this connection's
            outstanding = self.outstanding
            for receipt in args.receipts:
                outstanding.pop(receipt, None)
            self.credit.set()
            if how == "ack" and self._may_carry(args.receipts):
                self.carried.append(CarriedAck(args, _ref(frame)))
                self.carried_receipts += len(args.receipts)
                return
        await self._spawn_settle(how, args, _ref(frame))

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
            await self.send(error_frame(e, of=how, **about))
            return
        finally:
            self.settle_slots.release()
        stale = [args.receipts[i] for i in result.stale]
        await self.send(
            {"op": "settled", "of": how, "settled": result.settled, "stale": stale, **about}
        )

    def _may_carry(self, receipts: list[str]) -> bool:
        """Whether the consumer's next receive is to carry these acks: it waits for the
        credit they give (so it receives at once, settling them in the same entry) and
        they fit one receive's acks."""
        return (
            self.waiting_credit
            and not self.closed
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
            await self.send(
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

    def _forbidden(self, permission: str) -> Forbidden:
        return Forbidden(f"user {self.who.name!r} has no {permission} permission on {self.name!r}")


def _is_text(value: str) -> bool:
    """MessagePack text may carry lone surrogates, which are no UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def deliver_frame(batch: ReceivedBatch, packer: FramePacker) -> bytes:
    """The ``deliver`` frame of a received batch, packed (by the app's packer, whose
    buffer is kept: app/frame_packing.py): one map per message built straight from the
    batch's lists (no message object in between)."""
    expires_ms = batch.lease_expires_at_ms
    messages = [
        {
            "id": id_,
            "receipt": receipt,
            "body": body,
            "headers": headers,
            "priority": priority,
            "delivery_count": count,
            "published_at_ms": published_ms,
            "lease_expires_at_ms": expires_ms,
        }
        for id_, receipt, body, headers, priority, count, published_ms in zip(
            *batch.columns(), strict=True
        )
    ]
    return packer.pack({"op": "deliver", "messages": messages})


async def admit(state: State, websocket: WebSocket, name: str) -> tuple[QueueEngine, Principal]:
    """What REST checks before a message endpoint, for the handshake: the name, the
    token, a permission (write or read) on the queue, the engine and the queue."""
    check_queue_name(name)
    who = await bearer_principal(state, websocket.headers.get("authorization", ""))
    if not (who.can("write", name) or who.can("read", name)):
        raise Forbidden(f"user {who.name!r} has neither write nor read permission on {name!r}")
    node = node_or_none(state)
    if node is None:
        raise NoLeader("the queue engine is not running on this node")
    if all(q.name != name for q in node.queues()):
        raise QueueNotFound(f"no queue {name!r}")
    return node, who


async def stream(websocket: WebSocket) -> None:
    """The endpoint: admitted (else an HTTP problem instead of the upgrade), accepted,
    served until either side closes."""
    state: State = websocket.app.state
    name = str(websocket.path_params["name"])
    try:
        node, who = await admit(state, websocket, name)
    except (QuorraError, AppProblem) as e:
        await websocket.send_denial_response(typed_problem(e))
        return
    await websocket.accept()
    limits = settings_of(state).limits
    await StreamConnection(websocket, node, name, who, limits, frame_packer_of(state)).run()
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # gone already
        await websocket.close()


ROUTE = WebSocketRoute(STREAM_PATH, stream, name="queue_stream")
