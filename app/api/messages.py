"""``/api/v1/queues/{name}/messages``: publish, receive, ack, nack, extend and browse.

Bodies are JSON or MessagePack both ways (app/negotiation.py). In JSON a message body
is text: a client sends ``encoding: utf-8`` (default) or ``base64``; the server answers
``utf-8`` when the bytes are valid UTF-8 and ``base64`` otherwise. In MessagePack a
body is raw ``bin`` both ways and ``encoding`` is left out of answers.

Stale receipts (ack, nack, extend): a receipt whose lease ended (its message was or
will be handed out again) settles nothing. When at least one receipt of the request
settled, the answer is 200 with ``settled`` and the ``stale`` receipts; when every
receipt was stale it is 409 ``/problems/stale-receipt`` with the same two fields. A
receipt the queue did not make (its MAC does not match: forged, altered, or another
queue's; engine/queue/receipts.py) is answered exactly as a stale one, so that a guess
settles nothing and tells nothing. A malformed receipt (not 64 lowercase hex digits) is
422, and then nothing of the request is applied.

A receive may carry ``ack``, receipts to settle in the same Raft entry as its checkout
(engine/queue/checkout.py ``on_settle_checkout``): the answer adds ``settled`` and
``stale`` as above, always with 200, since the receive itself took place.

The five ``POST`` endpoints are ``MessageRoute``s (app/api/message_route.py): their
bodies are parsed by app/api/message_bodies.py, the only parser of message bodies.

A publish is all or nothing and answers 201 with one id per message only once the whole
batch is durable on a quorum. Batches over ``batch_messages_max`` messages or
``batch_bytes_max`` body bytes are 413 before the engine sees them; a message over the
queue's ``max_message_bytes`` is 413 from the engine, and nothing of the batch is kept.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgpack
import orjson
from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel

from app.api import message_bodies
from app.api.deps import API_PREFIX, QueueName
from app.api.message_route import MessageEndpoint, MessageRoute, admitted
from app.api.queue_deps import CanRead, NodeDep
from app.api.queue_schemas import (
    BrowseOut,
    ExtendIn,
    NackIn,
    PublishedOut,
    PublishIn,
    ReceivedBatchOut,
    ReceiveIn,
    SettledOut,
    SettleIn,
)
from app.api.queues import PROBLEMS
from app.auth import Principal
from app.negotiation import (
    JSON,
    MSGPACK,
    MSGPACK_RESPONSE,
    NegotiatedRoute,
    wants_msgpack,
)
from app.problems import problem_response, problem_responses
from app.state import settings_of
from engine.limits import Limits
from engine.runtime.api import (
    BrowsedMessage,
    QueueEngine,
    ReceivedBatch,
    SettleResult,
)

router = APIRouter(
    prefix=f"{API_PREFIX}/queues/{{name}}/messages", tags=["messages"], route_class=NegotiatedRoute
)

MESSAGE_PROBLEMS = PROBLEMS | problem_responses(413, 429)


def limits_of(request: Request) -> Limits:
    return settings_of(request.app.state).limits


# --- bodies in and out -------------------------------------------------------------


def encoded(payload: dict[str, object], binary: bool) -> tuple[bytes, str]:
    """``payload`` (only JSON types, and ``bytes`` bodies when ``binary``) as a response
    body and its media type: encoded once, without ``respond``'s generic walk."""
    if binary:
        return msgpack.packb(payload, use_bin_type=True), MSGPACK
    # orjson writes what json.dumps(ensure_ascii=False, separators=(",", ":")) does for
    # these payloads, some ten times faster for a batch of received messages.
    return orjson.dumps(payload), JSON


def answer(request: Request, payload: dict[str, object], status_code: int = 200) -> Response:
    return answer_in(payload, wants_msgpack(request), status_code)


def answer_in(payload: dict[str, object], binary: bool, status_code: int = 200) -> Response:
    body, media_type = encoded(payload, binary)
    return EncodedResponse(body, status_code, media_type)


class EncodedResponse(Response):
    """An encoded body with its two headers, made here: ``Response.__init__`` renders
    the content and builds the headers generically (a scan of given headers, the text
    charset rule), a cost on every message answer."""

    CONTENT_TYPES: ClassVar[dict[str, bytes]] = {JSON: JSON.encode(), MSGPACK: MSGPACK.encode()}

    def __init__(self, body: bytes, status_code: int, media_type: str) -> None:
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", self.CONTENT_TYPES[media_type]),
        ]


def iso_ms(epoch_ms: int) -> str:
    """``epoch_ms`` as ISO 8601 in UTC to the millisecond (``2026-11-29T06:25:22.123Z``).

    Every receive formats a lease's end and its messages' publish times, and a
    ``datetime`` made and formatted each time was a tenth of a single receive's app
    time: the text of the second is made once (``_second``) and the milliseconds added."""
    second, ms = divmod(epoch_ms, 1000)
    return f"{_second(second)}.{ms:03d}Z"


@functools.lru_cache(maxsize=256)
def _second(epoch_s: int) -> str:
    """The text of a second since the epoch, UTC, without its fraction and zone."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _put_body(item: dict[str, object], body: bytes, binary: bool) -> None:
    if binary:
        item["body"] = body
        return
    try:
        item["body"], item["encoding"] = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        item["body"], item["encoding"] = base64.b64encode(body).decode("ascii"), "base64"


def _settled(result: SettleResult, receipts: list[str]) -> Response | dict[str, object]:
    stale = [receipts[i] for i in result.stale]
    if stale and result.settled == 0 and len(stale) == len(receipts):
        return problem_response(
            409,
            "/problems/stale-receipt",
            "Stale receipt",
            "every receipt's lease had ended; receive the messages again",
            extra={"settled": 0, "stale": stale},
        )
    return {"settled": result.settled, "stale": stale}


# --- what the endpoints do --------------------------------------------------------


async def receive_batch(
    node: QueueEngine,
    name: str,
    who: Principal,
    *,
    max_messages: int,
    wait_ms: int,
    lease_ms: int | None,
    consumer: str | None,
    ack: list[str] | None,
    binary: bool,
) -> dict[str, object]:
    """``ack`` (when given, even empty) is settled by the same entry as the checkout;
    the answer then says what it settled and which of its receipts were stale, with
    200 even when all were (the receive itself took place)."""
    consumer = consumer or who.token_id or who.name
    batch = await node.ack_and_receive(
        name,
        ack=ack or [],
        consumer=consumer,
        max_messages=max_messages,
        wait_ms=wait_ms,
        lease_ms=lease_ms,
    )
    received = _received_out(batch, binary)
    if ack is None:
        return {"messages": received}
    return {
        "messages": received,
        "settled": batch.settled.settled,
        "stale": [ack[i] for i in batch.settled.stale],
    }


def _received_out(batch: ReceivedBatch, binary: bool) -> list[dict[str, object]]:
    """One dict per message, built in one go from the batch's lists (no message object
    in between). The times are formatted once per value: a batch shares one lease end,
    and the messages of one publish one publish time."""
    expires = iso_ms(batch.lease_expires_at_ms)
    times = {ms: iso_ms(ms) for ms in set(batch.published_at_ms)}
    columns = batch.columns()
    if binary:
        return [
            {
                "id": id_,
                "receipt": receipt,
                "body": body,
                "headers": headers,
                "priority": priority,
                "delivery_count": count,
                "published_at": times[published_ms],
                "lease_expires_at": expires,
            }
            for id_, receipt, body, headers, priority, count, published_ms in zip(
                *columns, strict=True
            )
        ]
    texts, encodings = _texts(batch.bodies)
    return [
        {
            "id": id_,
            "receipt": receipt,
            "body": text,
            "encoding": encoding,
            "headers": headers,
            "priority": priority,
            "delivery_count": count,
            "published_at": times[published_ms],
            "lease_expires_at": expires,
        }
        for (id_, receipt, _body, headers, priority, count, published_ms), text, encoding in zip(
            zip(*columns, strict=True), texts, encodings, strict=True
        )
    ]


def _texts(bodies: list[bytes]) -> tuple[list[str], list[str]]:
    """Bodies as JSON text and their ``encoding``: UTF-8 when the bytes are valid UTF-8
    (decoded all at once while they are, the usual case), else base64."""
    try:
        return [body.decode("utf-8") for body in bodies], [_UTF8] * len(bodies)
    except UnicodeDecodeError:
        pass
    texts: list[str] = []
    encodings: list[str] = []
    for body in bodies:
        try:
            texts.append(body.decode("utf-8"))
            encodings.append(_UTF8)
        except UnicodeDecodeError:
            texts.append(base64.b64encode(body).decode("ascii"))
            encodings.append(_BASE64)
    return texts, encodings


_UTF8, _BASE64 = "utf-8", "base64"


async def settle(
    node: QueueEngine, name: str, how: str, receipts: list[str], *, requeue: bool, lease_ms: int
) -> Response | dict[str, object]:
    """``how``: ack, nack (``requeue``) or extend (to ``lease_ms``)."""
    if how == "ack":
        result = await node.ack(name, receipts)
    elif how == "nack":
        result = await node.nack(name, receipts, requeue=requeue)
    else:
        assert how == "extend"
        result = await node.extend(name, receipts, lease_ms)
    return _settled(result, receipts)


# --- endpoints -------------------------------------------------------------------


def _message_route(
    path: str, body_model: type[BaseModel], **kwargs: Any
) -> Callable[[MessageEndpoint], MessageEndpoint]:
    """Add the decorated endpoint to ``router`` as a ``MessageRoute`` (app/api/message_route.py)."""

    def add(endpoint: MessageEndpoint) -> MessageEndpoint:
        route = MessageRoute(
            router.prefix + path, endpoint, body_model=body_model, tags=router.tags, **kwargs
        )
        router.routes.append(route)
        return endpoint

    return add


@_message_route(
    "",
    PublishIn,
    status_code=status.HTTP_201_CREATED,
    response_model=PublishedOut,
    responses={**MESSAGE_PROBLEMS, 201: MSGPACK_RESPONSE},
)
async def publish(name: QueueName, request: Request) -> Response:
    """Publish a batch, all or nothing; 201 once it is durable on a quorum."""
    a = await admitted(request, name, "write")
    batch = message_bodies.publish_items(a.payload, limits_of(request))
    ids = await a.node.publish(name, batch)
    return answer_in({"ids": ids}, a.binary, status.HTTP_201_CREATED)


@_message_route(
    "/receive",
    ReceiveIn,
    response_model=ReceivedBatchOut,
    responses={**MESSAGE_PROBLEMS, 200: MSGPACK_RESPONSE},
)
async def receive(name: QueueName, request: Request) -> Response:
    """Lease up to ``max_messages``; waits up to ``wait_ms`` for the first to arrive.
    With ``ack``, those receipts are settled in the same durable step."""
    a = await admitted(request, name, "read")
    args = message_bodies.receive_args(a.payload)
    received = await receive_batch(
        a.node,
        name,
        a.who,
        max_messages=args.max_messages,
        wait_ms=args.wait_ms,
        lease_ms=args.lease_ms,
        consumer=args.consumer,
        ack=args.ack,
        binary=a.binary,
    )
    return answer_in(received, a.binary)


async def _settle_endpoint(how: str, name: str, request: Request) -> Response:
    a = await admitted(request, name, "read")
    args = message_bodies.settle_args(how, a.payload)
    settled = await settle(
        a.node, name, how, args.receipts, requeue=args.requeue, lease_ms=args.lease_ms
    )
    return settled if isinstance(settled, Response) else answer_in(settled, a.binary)


@_message_route("/ack", SettleIn, response_model=SettledOut, responses=MESSAGE_PROBLEMS)
async def ack(name: QueueName, request: Request) -> Response:
    """Settle messages: they leave the queue."""
    return await _settle_endpoint("ack", name, request)


@_message_route("/nack", NackIn, response_model=SettledOut, responses=MESSAGE_PROBLEMS)
async def nack(name: QueueName, request: Request) -> Response:
    """Give messages back (``requeue``), or dead-letter them (``requeue: false``)."""
    return await _settle_endpoint("nack", name, request)


@_message_route("/extend", ExtendIn, response_model=SettledOut, responses=MESSAGE_PROBLEMS)
async def extend(name: QueueName, request: Request) -> Response:
    """Extend leases to ``lease_ms`` from now."""
    return await _settle_endpoint("extend", name, request)


def _message_out(item: dict[str, object], m: BrowsedMessage, binary: bool) -> dict[str, object]:
    """``item`` (its id fields) completed with the body and what every message shows."""
    _put_body(item, m.body, binary)
    item |= {
        "headers": m.headers,
        "priority": m.priority,
        "delivery_count": m.delivery_count,
        "published_at": iso_ms(m.published_at_ms),
    }
    return item


@router.get("", response_model=BrowseOut, responses={**MESSAGE_PROBLEMS, 200: MSGPACK_RESPONSE})
async def browse(
    name: QueueName,
    request: Request,
    _who: CanRead,
    node: NodeDep,
    limit: int = Query(default=100, ge=1, le=1000),
    after: int | None = Query(default=None, ge=0, le=(1 << 62), description="A `cursor`."),
) -> Response:
    """Look at messages in queue order without leasing them."""
    browsed = await node.browse(name, after=after, limit=limit)
    binary = wants_msgpack(request)
    out = [_message_out({"id": m.id, "cursor": m.cursor}, m, binary) for m in browsed]
    next_after = browsed[-1].cursor if len(browsed) == limit else None
    return answer(request, {"messages": out, "next_after": next_after})
