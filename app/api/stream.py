"""``GET /api/v1/queues/{name}/stream``: publish and consume on one WebSocket.

The handshake carries the bearer token as every REST call does (``Authorization:
Bearer``); a refused one is answered as REST would, with an HTTP problem instead of the
upgrade (401 bad token, 403 neither write nor read on the queue, 404 no such queue, 422
a bad name, 503 no engine). Then each WebSocket message is one binary MessagePack map, a
*frame*, with an ``op`` (the frame format is in README.md, "Streams", and the OpenAPI
description).

Rules:

- A publish frame is confirmed only once its messages are durable on a quorum: from the
  apply of their entry, in that turn of the loop (``node.publish``'s ``on_durable``, written
  at once by ``send_now``: app/ws_protocol.py), else once ``node.publish`` returned (a queue
  led elsewhere, a transport above its high-water mark). Frames are published in the order
  they arrive, several at once when they queue up behind a publish in flight (one engine
  batch, one Raft command), and every frame gets exactly one answer: a ``confirm``
  (cumulative: every publish up to that ``seq`` without an ``error`` frame of its own) or an
  ``error``. A merged batch the engine refuses whole is published again frame by frame, so
  that one bad frame never fails its neighbours.
- A publish frame that arrives while the reader waits for a frame, and leaves room in
  the window, is taken in the callback that read it (``take``, through the protocol's
  ``TAKE_NOW``: app/ws_protocol.py), sparing the wake-up of the reader task; any other
  frame goes to the reader, decoded once, so frames are still handled in order.
- The window: at ``stream_unconfirmed_messages_max`` messages (or ``..._bytes_max``
  bytes) unconfirmed, the server stops reading the socket until confirms free room; the
  WebSocket protocol under it reads nothing more (uvicorn's websockets-sansio), so TCP
  pushes back on the client. Memory per connection is bounded by the window plus one
  frame, whatever the client sends.
- Consuming (app/api/stream_consume.py): ``consume`` sets the prefetch credit; the
  server keeps at most that many messages delivered and not yet acked or nacked on the
  connection, pushing more as they arrive. ``ack``/``nack``/``extend`` settle receipts
  as the REST endpoints do. Acks that come while the consumer waits for the credit they
  give ride on its next receive (one Raft entry settles them and leases the next batch,
  as a REST receive carrying ``ack``); each ack frame is still answered by itself, as if
  settled alone.
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import msgpack
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import State
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from app.api import message_bodies
from app.api.deps import API_PREFIX, bearer_principal
from app.api.stream_consume import StreamConsumer
from app.api.stream_frames import FrameError, confirm_frame, error_frame, forbidden, refusal
from app.auth import Principal
from app.deliver_frames import FrameChunks
from app.names import check_queue_name
from app.negotiation import unpackb
from app.problems import AppProblem, Forbidden, typed_problem
from app.state import node_or_none, publish_trace_of, settings_of
from app.ws_protocol import SEND_NOW, TAKE_NOW
from engine.errors import InvalidRequest, NoLeader, QueueNotFound, QuorraError, ValidationFailed
from engine.limits import Limits
from engine.publish_trace import PublishTrace, Stage
from engine.runtime.api import OutgoingMessage, PublishItem, QueueEngine, item_body, outgoing
from engine.runtime.meta import DEDUP_ID_BYTES_MAX

log = logging.getLogger("quorra.app")

STREAM_PATH = f"{API_PREFIX}/queues/{{name}}/stream"
PUBLISH_KEYS = frozenset({"op", "seq", "messages", "dedup_id"})
SEQ_MAX = (1 << 63) - 1


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
| client | `publish`: `seq` (above the last), `messages` (as a publish body, bodies as bytes), optional `dedup_id` (the frame's); needs `write` |
| server | `confirm`: `seq`; every publish up to it without its own `error` is durable on a quorum |
| client | `consume`: `prefetch` (0 pauses), `lease_ms`, `consumer`, `columns`; needs `read` |
| server | `deliver`: `messages` (`id`, `receipt`, `body`, `headers`, `priority`, `delivery_count`, `published_at_ms`, `lease_expires_at_ms`) |
| server | `deliver` with `columns: true` (asked for by `consume`): `count` and a packed little-endian binary per column (`ids`, `receipts`, `priorities`, `delivery_counts`, `published_at_ms`, `body_offsets`, `header_offsets`), `header_keys`, `header_values`, `lease_expires_at_ms`, `bodies` (concatenated) |
| client | `ack`, `nack` (`requeue`), `extend` (`lease_ms`): `receipts`, `ref`; ack and nack give credit back |
| server | `settled`: `of`, `settled`, `stale`, `ref` |
| server | `error`: `type`, `title`, `status`, `detail` (RFC 9457), `of`, `seq` or `ref` |

A publish frame's `dedup_id` (1..255 bytes of text) stands for all its messages, which
then carry none of their own: a frame whose id was published within the queue's dedup
window is confirmed and enqueues nothing (a batch writer resending the same frames after
a failure publishes nothing twice). At most `window_messages` publishes unconfirmed: the server then stops reading the
socket until confirms free room. At most `prefetch` deliveries unsettled. A bad frame
gets an `error` frame and changes nothing. A closed socket's leases return at once
(delivered again with `delivery_count` + 1). The Python client is `quorra.client`.
"""


@dataclass(frozen=True, slots=True)
class PendingPublish:
    seq: int
    messages: list[PublishItem]
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
        messages = message_bodies.publish_items(payload, limits)
        if "dedup_id" in frame:
            messages = framed(messages, frame["dedup_id"])
    except (RequestValidationError, QuorraError) as e:
        raise FrameError(refusal(e), of="publish", seq=seq) from None
    size = sum(len(m) if type(m) is bytes else len(item_body(m)) for m in messages)
    return PendingPublish(seq, messages, size)


class Nudge:
    """``asyncio.Event`` for one task that looks at its own condition before each wait
    (``while not ready: await nudge.wait()``): a ``set`` with no task waiting is not
    kept, since the task sees the condition itself. Without the event's flag and its
    list of waiters, a publish's wake-up of the publishing task costs one future."""

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        await waiter


def framed(messages: list[PublishItem], dedup_id: object) -> list[PublishItem]:
    """A frame's messages under its ``dedup_id``: the first one heads the frame
    (``OutgoingMessage.frame_count``); ``ValidationFailed`` if the id is no text of
    1..255 bytes or a message has a dedup id of its own."""
    try:
        size = len(dedup_id.encode()) if isinstance(dedup_id, str) else 0
    except UnicodeEncodeError:
        size = 0
    if not isinstance(dedup_id, str) or not 1 <= size <= DEDUP_ID_BYTES_MAX:
        raise ValidationFailed(f"dedup_id must be text of 1..{DEDUP_ID_BYTES_MAX} bytes")
    for k, m in enumerate(messages):
        if type(m) is tuple or (type(m) is OutgoingMessage and m.dedup_id is not None):
            raise ValidationFailed(
                f"messages[{k}] has a dedup_id: a frame with a dedup_id takes none per message"
            )
    head = replace(outgoing(messages[0]), dedup_id=dedup_id, frame_count=len(messages))
    return [head, *messages[1:]]


class StreamConnection:
    """One accepted stream: a reader (this task), a publisher and a consumer task."""

    def __init__(
        self,
        websocket: WebSocket,
        node: QueueEngine,
        name: str,
        who: Principal,
        limits: Limits,
        trace: PublishTrace | None = None,
    ) -> None:
        self.ws, self.node, self.name, self.who, self.limits = websocket, node, name, who, limits
        self.trace = trace
        """Stamps a publish's first and last stages (``engine.publish_trace``), if set."""
        self.closed = False
        # publishing: frames read and not yet answered, oldest first
        self.pending: deque[PendingPublish] = deque()
        self.last_seq = -1
        self.unconfirmed_messages = 0
        self.unconfirmed_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self.work = Nudge()
        """Wakes the publishing task: a frame to publish, or the connection closed."""
        self.send_now: Callable[[bytes], bool] | None = websocket.scope.get("extensions", {}).get(
            SEND_NOW
        )
        """Writes a frame in this loop turn (False if it cannot), if the server offers it."""
        self.confirmed_now = -1
        """The last seq confirmed from the apply (``on_durable``)."""
        self.take_now: Callable[[Callable[[bytes], bool] | None], None] | None = (
            websocket.scope.get("extensions", {}).get(TAKE_NOW)
        )
        self.receiving = False
        """The reader waits for the next frame (with nothing of the last one left to do)."""
        self.decoded: tuple[bytes, object] | None = None
        """A frame ``take`` decoded and gave to the reader, with its bytes."""
        self.consuming = StreamConsumer(self, node, name, who, limits)

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
        consumer = loop.create_task(self.guarded(self.consuming.consume_loop()))
        if self.take_now is not None:
            self.take_now(self.take)
        try:
            await self.read_loop()
        finally:
            if self.take_now is not None:
                self.take_now(None)
            self.closed = True
            self.work.set()
            self.consuming.wake()
            self.room.set()
            # None of these is cancelled: a publish or checkout in flight may already be
            # applied, and what it did must be answered (or its leases returned).
            settles = self.consuming.settles
            await asyncio.gather(publisher, consumer, *settles, return_exceptions=True)
            await self.consuming.settle_carried()
            await self.consuming.return_leases()

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
            self.consuming.wake()
            self.room.set()
            with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
                await self.ws.close(1011)

    async def send(self, frame: dict[str, object]) -> None:
        """Send one frame; a connection gone meanwhile only marks it closed."""
        await self.send_packed(msgpack.packb(frame, use_bin_type=True))

    async def send_packed(self, frame: bytes | FrameChunks) -> None:
        """``send`` of a frame already packed (a ``deliver`` frame's chunks go out as
        they are: app/ws_protocol.py)."""
        if self.closed:
            return
        try:
            await self.ws.send({"type": "websocket.send", "bytes": frame})
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True
            self.work.set()
            self.consuming.wake()
            self.room.set()

    async def read_loop(self) -> None:
        while not self.closed:
            # The window: no frame is read while it is full.
            while not self.closed and self.window_full():
                self.room.clear()
                await self.room.wait()
            if self.closed:
                return
            self.receiving = True
            try:
                message = await self.ws.receive()
            finally:
                self.receiving = False
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            try:
                if data is None:
                    raise FrameError(InvalidRequest("frames are binary MessagePack maps"))
                await self.on_frame(data)
            except FrameError as e:
                await self.send(error_frame(e.problem, **e.about))

    def window_full(self, messages: int = 0, body_bytes: int = 0) -> bool:
        """Whether the unconfirmed publishes, with ``messages`` and ``body_bytes`` more,
        fill the window (the reader then reads no frame until confirms free room)."""
        limits = self.limits
        return (
            self.unconfirmed_messages + messages >= limits.stream_unconfirmed_messages_max
            or self.unconfirmed_bytes + body_bytes >= limits.stream_unconfirmed_bytes_max
        )

    def take(self, data: bytes) -> bool:
        """A whole frame, as the protocol reads it: taken if it is a publish frame that
        arrived while the reader waits and leaves room in the window (the reader then
        reads on, as after any such frame); else False, for the reader, which refuses a
        bad frame with its error frame as always. Never raises."""
        if not self.receiving or self.closed:
            return False
        try:
            frame = unpackb(data)
        except InvalidRequest:
            return False
        self.decoded = (data, frame)
        if type(frame) is not dict or frame.get("op") != "publish":
            return False
        try:
            publish = self._checked(frame)
        except FrameError:
            return False
        if self.window_full(len(publish.messages), publish.body_bytes):
            return False  # the reader takes it and then waits for room
        self.decoded = None
        self._accept(publish)
        return True

    async def on_frame(self, data: bytes) -> None:
        decoded, self.decoded = self.decoded, None
        if decoded is not None and decoded[0] is data:
            frame = decoded[1]
        else:
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
            self.consuming.on_consume(frame)
        elif op in message_bodies.SETTLE_MODELS:
            await self.consuming.on_settle(op, frame)
        else:
            raise FrameError(
                InvalidRequest(f"unknown op {op[:40]!r}: publish, consume, ack, nack or extend")
            )

    # --- publishing -------------------------------------------------------------------

    def on_publish(self, frame: dict[str, Any]) -> None:
        self._accept(self._checked(frame))

    def _checked(self, frame: dict[str, Any]) -> PendingPublish:
        """A publish frame's messages if the connection may publish them; ``FrameError``
        otherwise. Changes nothing."""
        seq = frame.get("seq")
        about = {"seq": seq} if type(seq) is int else {}
        if not self.who.can("write", self.name):
            raise FrameError(forbidden(self.who, self.name, "write"), of="publish", **about)
        return publish_frame(frame, self.last_seq, self.limits)

    def _accept(self, publish: PendingPublish) -> None:
        """Take a checked publish into the window (its trace starts here, once, whichever
        of ``take`` and the reader took it)."""
        if self.trace is not None:
            self.trace.stamp(Stage.RECEIVED)
        self.last_seq = publish.seq
        self.pending.append(publish)
        self.unconfirmed_messages += len(publish.messages)
        self.unconfirmed_bytes += publish.body_bytes
        self.work.set()

    async def publish_loop(self) -> None:
        while True:
            while not self.pending and not self.closed:
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
            await self.node.publish(self.name, messages, partial(self.on_durable, frames[-1].seq))
        except QuorraError as e:
            # A refusal of the merged batch (4xx) may be one frame's: each alone then.
            # An error of the server or its quorum (5xx) is every frame's, as it is.
            if len(frames) == 1 or e.status >= 500:
                return [e] * len(frames)
            return [await self._publish_one(f) for f in frames]
        return [None] * len(frames)

    def on_durable(self, seq: int) -> None:
        """In the apply of the batch in flight (all of it durable): its cumulative
        confirm, of ``seq`` (the batch's last frame), written in this loop turn if the transport takes it at once. Every
        earlier answer of this connection was written already (``publish_loop`` answers
        a batch before it publishes the next). Never raises: it runs inside the apply."""
        send_now = self.send_now
        if send_now is None or self.closed:
            return
        try:
            sent = send_now(confirm_frame(seq))
        except (RuntimeError, OSError):
            return  # the connection is going: ``_answer`` finds it closed
        if sent:
            self.confirmed_now = seq
            if self.trace is not None:
                self.trace.stamp(Stage.SENT)

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
                await self.send_packed(confirm_frame(confirmed))
                confirmed = None
            await self.send(error_frame(outcome, of="publish", seq=frame.seq))
        if confirmed is not None and confirmed != self.confirmed_now:
            await self.send_packed(confirm_frame(confirmed))
            if self.trace is not None:
                self.trace.stamp(Stage.SENT)

    # --- consuming --------------------------------------------------------------------


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
    await StreamConnection(websocket, node, name, who, limits, publish_trace_of(state)).run()
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # gone already
        await websocket.close()


ROUTE = WebSocketRoute(STREAM_PATH, stream, name="queue_stream")
