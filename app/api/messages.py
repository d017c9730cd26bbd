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

A publish is all or nothing and answers 201 with one id per message only once the whole
batch is durable on a quorum. Batches over ``batch_messages_max`` messages or
``batch_bytes_max`` body bytes are 413 before the engine sees them; a message over the
queue's ``max_message_bytes`` is 413 from the engine, and nothing of the batch is kept.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime

import msgpack
import orjson
from fastapi import APIRouter, Query, Request, Response, status

from app.api.deps import API_PREFIX, QueueName
from app.api.queue_deps import CanRead, CanWrite, NodeDep
from app.api.queue_schemas import (
    BrowseOut,
    ExtendIn,
    MessageIn,
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
    openapi_msgpack,
    wants_msgpack,
)
from app.problems import problem_response, problem_responses
from app.state import settings_of
from engine.errors import InvalidRequest, MessageTooLarge
from engine.limits import Limits
from engine.runtime.api import (
    BrowsedMessage,
    OutgoingMessage,
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


def body_bytes(message: MessageIn, position: int) -> bytes:
    if isinstance(message.body, bytes):
        return message.body
    if message.encoding == "base64":
        try:
            return base64.b64decode(message.body, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"messages[{position}].body is not valid base64") from None
    try:
        return message.body.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"messages[{position}].body is not valid UTF-8 text") from None


def _check_text(text: str, where: str) -> None:
    """JSON may carry lone surrogates, which are no UTF-8: 400, before the engine."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{where} is not valid UTF-8 text") from None


def _check_strings(message: MessageIn, position: int) -> None:
    for key, value in message.headers.items():
        _check_text(key, f"messages[{position}].headers")
        _check_text(value, f"messages[{position}].headers")
    if message.dedup_id is not None:
        _check_text(message.dedup_id, f"messages[{position}].dedup_id")


def outgoing(batch: PublishIn, limits: Limits) -> list[OutgoingMessage]:
    """The engine's messages; 413 for a batch over the request limits."""
    if len(batch.messages) > limits.batch_messages_max:
        raise MessageTooLarge(
            f"{len(batch.messages)} messages in one batch; at most {limits.batch_messages_max}"
        )
    out: list[OutgoingMessage] = []
    total = 0
    for position, m in enumerate(batch.messages):
        body = body_bytes(m, position)
        _check_strings(m, position)
        total += len(body)
        out.append(OutgoingMessage(body, m.headers, m.priority, m.ttl_ms, m.delay_ms, m.dedup_id))
    if total > limits.batch_bytes_max:
        raise MessageTooLarge(f"{total} body bytes in one batch; at most {limits.batch_bytes_max}")
    return out


def encoded(payload: dict[str, object], binary: bool) -> tuple[bytes, str]:
    """``payload`` (only JSON types, and ``bytes`` bodies when ``binary``) as a response
    body and its media type: encoded once, without ``respond``'s generic walk."""
    if binary:
        return msgpack.packb(payload, use_bin_type=True), MSGPACK
    # orjson writes what json.dumps(ensure_ascii=False, separators=(",", ":")) does for
    # these payloads, some ten times faster for a batch of received messages.
    return orjson.dumps(payload), JSON


def answer(request: Request, payload: dict[str, object], status_code: int = 200) -> Response:
    body, media_type = encoded(payload, wants_msgpack(request))
    return Response(body, status_code, media_type=media_type)


def _iso(epoch_ms: int) -> str:
    return (
        datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


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


# --- what the endpoints do, shared with the hot paths (app/hot_paths.py) ------------


async def publish_batch(
    node: QueueEngine, name: str, messages: list[OutgoingMessage]
) -> dict[str, object]:
    return {"ids": await node.publish(name, messages)}


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
    _check_text(consumer, "consumer")
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
    expires = _iso(batch.lease_expires_at_ms)
    times: dict[int, str] = {}
    out: list[dict[str, object]] = []
    for id_, receipt, body, headers, priority, count, published_ms in zip(
        batch.ids,
        batch.receipts,
        batch.bodies,
        batch.headers,
        batch.priorities,
        batch.delivery_counts,
        batch.published_at_ms,
        strict=True,
    ):
        item: dict[str, object] = {"id": id_, "receipt": receipt}
        _put_body(item, body, binary)
        published = times.get(published_ms)
        if published is None:
            published = times[published_ms] = _iso(published_ms)
        item["headers"] = headers
        item["priority"] = priority
        item["delivery_count"] = count
        item["published_at"] = published
        item["lease_expires_at"] = expires
        out.append(item)
    return out


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


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PublishedOut,
    responses={**MESSAGE_PROBLEMS, 201: MSGPACK_RESPONSE},
    openapi_extra=openapi_msgpack(PublishIn),
)
async def publish(
    name: QueueName, body: PublishIn, request: Request, _who: CanWrite, node: NodeDep
) -> Response:
    """Publish a batch, all or nothing; 201 once it is durable on a quorum."""
    published = await publish_batch(node, name, outgoing(body, limits_of(request)))
    return answer(request, published, status.HTTP_201_CREATED)


@router.post(
    "/receive",
    response_model=ReceivedBatchOut,
    responses={**MESSAGE_PROBLEMS, 200: MSGPACK_RESPONSE},
    openapi_extra=openapi_msgpack(ReceiveIn),
)
async def receive(
    name: QueueName, body: ReceiveIn, request: Request, who: CanRead, node: NodeDep
) -> Response:
    """Lease up to ``max_messages``; waits up to ``wait_ms`` for the first to arrive.
    With ``ack``, those receipts are settled in the same durable step."""
    received = await receive_batch(
        node,
        name,
        who,
        max_messages=body.max_messages,
        wait_ms=body.wait_ms,
        lease_ms=body.lease_ms,
        consumer=body.consumer,
        ack=body.ack,
        binary=wants_msgpack(request),
    )
    return answer(request, received)


def _message_out(item: dict[str, object], m: BrowsedMessage, binary: bool) -> dict[str, object]:
    """``item`` (its id fields) completed with the body and what every message shows."""
    _put_body(item, m.body, binary)
    item |= {
        "headers": m.headers,
        "priority": m.priority,
        "delivery_count": m.delivery_count,
        "published_at": _iso(m.published_at_ms),
    }
    return item


@router.post(
    "/ack",
    response_model=SettledOut,
    responses=MESSAGE_PROBLEMS,
    openapi_extra=openapi_msgpack(SettleIn),
)
async def ack(
    name: QueueName, body: SettleIn, _who: CanRead, node: NodeDep
) -> Response | dict[str, object]:
    """Settle messages: they leave the queue."""
    return await settle(node, name, "ack", body.receipts, requeue=False, lease_ms=0)


@router.post(
    "/nack",
    response_model=SettledOut,
    responses=MESSAGE_PROBLEMS,
    openapi_extra=openapi_msgpack(NackIn),
)
async def nack(
    name: QueueName, body: NackIn, _who: CanRead, node: NodeDep
) -> Response | dict[str, object]:
    """Give messages back (``requeue``), or dead-letter them (``requeue: false``)."""
    return await settle(node, name, "nack", body.receipts, requeue=body.requeue, lease_ms=0)


@router.post(
    "/extend",
    response_model=SettledOut,
    responses=MESSAGE_PROBLEMS,
    openapi_extra=openapi_msgpack(ExtendIn),
)
async def extend(
    name: QueueName, body: ExtendIn, _who: CanRead, node: NodeDep
) -> Response | dict[str, object]:
    """Extend leases to ``lease_ms`` from now."""
    return await settle(node, name, "extend", body.receipts, requeue=False, lease_ms=body.lease_ms)


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
