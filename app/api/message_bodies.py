"""The only parser of message request bodies: publish, receive, ack, nack and extend, in
JSON and MessagePack, for the REST routes (app/api/messages.py) and the stream frames
(app/api/stream.py).

Rule: a body is checked here, once, without pydantic; the pydantic models of
app/api/queue_schemas.py state the same bounds in the OpenAPI document and are read here
(their JSON schema), and they are asked only to *explain* a refusal: when a body is
refused, the model validates it, and its errors are the 422 answer; when the model
accepts what this parser refused, the parser's own reason is the answer (a base64 body
that does not decode, text that is no UTF-8: 400; a batch over the limits: 413), so
that schema errors come first, as they would from the model alone. Types are exact
(``type(x) is int``), as the models are strict: ``"5"``, ``5.0`` and ``true`` are no
integer, bytes no text. ``BODY_FIELDS`` names the fields parsed per model: a field the
schema gains must be parsed here too (tests/app/test_message_bodies.py compares them, and
checks on random bodies that this parser and the models accept the same ones).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, cast

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from app.api.queue_schemas import ExtendIn, MessageIn, NackIn, PublishIn, ReceiveIn, SettleIn
from app.negotiation import JSON, MSGPACK, MSGPACK_ALIASES, media_type, unpackb
from app.problems import UnsupportedMediaType
from engine.errors import InvalidRequest, MessageTooLarge, QuorraError, ValidationFailed
from engine.limits import Limits
from engine.queue.receipts import RECEIPT_CHARS, are_receipt_texts
from engine.runtime.api import OutgoingMessage, PublishItem, body_only, outgoing

# --- bytes to values ---------------------------------------------------------------


def decoded(content_type: str, raw: bytes) -> object:
    """The body's value; ``None`` for an empty body (the models then say it is missing).

    JSON (also ``+json`` types, and a body without a media type) is read by orjson, three
    to ten times faster than the standard library; what orjson refuses and the standard
    library reads (a byte-order mark, lone surrogates, NaN, numbers out of range) is read
    by the latter, so that such a body gets the answer its values deserve. orjson reads
    integers beyond 64 bits as floats, which no field takes: refused either way.
    """
    kind = media_type(content_type)
    if kind in MSGPACK_ALIASES:
        return unpackb(raw) if raw else None
    if kind and kind != JSON and not kind.endswith("+json"):
        raise UnsupportedMediaType(f"send {JSON} or {MSGPACK}, not {kind}")
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except ValueError:  # UnicodeDecodeError too
        raise InvalidRequest("the body is not valid JSON") from None


# --- refusals ----------------------------------------------------------------------


class _Refused(Exception):
    """This parser does not take the body; ``reason``, when the schema would."""

    def __init__(self, reason: QuorraError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason


class UnexplainedRefusal(ValidationFailed):
    """A body the model accepts and this parser refuses without a reason of its own: a
    parser stricter than its schema (a bug; the property tests look for it)."""


def _explained(model: type[BaseModel], payload: object, reason: QuorraError | None) -> Exception:
    """What to answer for a refused body: the model's errors, else ``reason``."""
    if payload is None:
        return RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
        )
    try:
        model.model_validate(payload)
    except ValidationError as e:
        errors = e.errors(include_url=False, include_context=False, include_input=False)
        return RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in errors])
    return reason or UnexplainedRefusal(f"the body is not a valid {model.__name__}")


# --- bounds, from the schemas ------------------------------------------------------


def _properties(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    properties: dict[str, dict[str, Any]] = model.model_json_schema()["properties"]
    return properties


def _non_null(prop: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema of a property without its ``null`` alternative, and whether it had one."""
    if "anyOf" not in prop:
        return prop, False
    kinds = [p for p in prop["anyOf"] if p.get("type") != "null"]
    assert len(kinds) == 1, prop
    return kinds[0], len(kinds) < len(prop["anyOf"])


@dataclass(frozen=True, slots=True)
class IntField:
    lo: int
    hi: int
    nullable: bool
    default: int | None

    def accepts(self, value: object) -> bool:
        if value is None:
            return self.nullable
        return type(value) is int and self.lo <= value <= self.hi


@dataclass(frozen=True, slots=True)
class TextField:
    chars_min: int
    chars_max: int
    nullable: bool

    def accepts(self, value: object) -> bool:
        if value is None:
            return self.nullable
        return type(value) is str and self.chars_min <= len(value) <= self.chars_max


def int_field(model: type[BaseModel], name: str) -> IntField:
    prop = _properties(model)[name]
    kind, nullable = _non_null(prop)
    assert kind["type"] == "integer", prop
    lo = kind.get("minimum", kind.get("ge"))
    hi = kind.get("maximum", kind.get("le"))
    assert isinstance(lo, int) and isinstance(hi, int), prop
    return IntField(lo, hi, nullable, prop.get("default"))


def text_field(model: type[BaseModel], name: str) -> TextField:
    prop = _properties(model)[name]
    kind, nullable = _non_null(prop)
    assert kind["type"] == "string", prop
    return TextField(kind["minLength"], kind["maxLength"], nullable)


def _receipts_field(model: type[BaseModel]) -> tuple[int, int, re.Pattern[str]]:
    prop = _properties(model)["receipts"]
    return prop["minItems"], prop["maxItems"], re.compile(prop["items"]["pattern"])


BODY_FIELDS: dict[type[BaseModel], frozenset[str]] = {
    PublishIn: frozenset({"messages"}),
    MessageIn: frozenset(
        {"body", "encoding", "headers", "priority", "ttl_ms", "delay_ms", "dedup_id"}
    ),
    ReceiveIn: frozenset({"max_messages", "wait_ms", "lease_ms", "consumer", "ack"}),
    SettleIn: frozenset({"receipts"}),
    NackIn: frozenset({"receipts", "requeue"}),
    ExtendIn: frozenset({"receipts", "lease_ms"}),
}
"""The fields each function below reads: every other key is refused (the models forbid
extra fields). Asserted equal to the models' fields at import, so that a field added to a
model without its parsing here stops the server from starting."""
for _model, _fields in BODY_FIELDS.items():
    assert frozenset(_properties(_model)) == _fields, (_model.__name__, _fields)

_MESSAGE_KEYS = BODY_FIELDS[MessageIn]
_ENCODINGS = frozenset(_properties(MessageIn)["encoding"]["enum"])
_PRIORITY = int_field(MessageIn, "priority")
_TTL_MS = int_field(MessageIn, "ttl_ms")
_DELAY_MS = int_field(MessageIn, "delay_ms")
_DEDUP_ID = text_field(MessageIn, "dedup_id")
_MESSAGES_MIN = _properties(PublishIn)["messages"]["minItems"]
_RECEIVE_KEYS = BODY_FIELDS[ReceiveIn]
_MAX_MESSAGES = int_field(ReceiveIn, "max_messages")
_WAIT_MS = int_field(ReceiveIn, "wait_ms")
_RECEIVE_LEASE_MS = int_field(ReceiveIn, "lease_ms")
_CONSUMER = text_field(ReceiveIn, "consumer")
_ACK = _non_null(_properties(ReceiveIn)["ack"])[0]
_ACK_MAX = _ACK["maxItems"]
assert (
    "minItems" not in _ACK
    and _ACK["items"]["pattern"] == _properties(SettleIn)["receipts"]["items"]["pattern"]
), _ACK
_RECEIPTS_MIN, _RECEIPTS_MAX, _RECEIPT = _receipts_field(SettleIn)
assert _RECEIPT.pattern == f"^[0-9a-f]{{{RECEIPT_CHARS}}}$", _RECEIPT.pattern
"""The schema's rule is ``are_receipt_texts``' (which checks a whole list at once)."""
SETTLE_MODELS: dict[str, type[BaseModel]] = {"ack": SettleIn, "nack": NackIn, "extend": ExtendIn}
_SETTLE_KEYS = {how: BODY_FIELDS[model] for how, model in SETTLE_MODELS.items()}
_EXTEND_LEASE_MS = int_field(ExtendIn, "lease_ms")
_DEFAULT_REQUEUE = _properties(NackIn)["requeue"]["default"]
assert _RECEIPTS_MIN >= 1 and _MESSAGES_MIN >= 1
assert (
    _receipts_field(NackIn)[:2] == _receipts_field(ExtendIn)[:2] == (_RECEIPTS_MIN, _RECEIPTS_MAX)
)


# --- publish -----------------------------------------------------------------------


def _text(value: str, where: str) -> None:
    """JSON may carry lone surrogates, which are no UTF-8: 400, before the engine."""
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refused(InvalidRequest(f"{where} is not valid UTF-8 text")) from None


def _headers(value: object, where: str) -> dict[str, str]:
    if type(value) is not dict:
        raise _Refused
    for k, v in value.items():
        if type(k) is not str or type(v) is not str:
            raise _Refused
        _text(k, where)
        _text(v, where)
    return value


def _body(value: object, encoding: object, position: int) -> bytes:
    if type(encoding) is not str or encoding not in _ENCODINGS:
        raise _Refused  # a bytes body too: the schema checks every field
    if type(value) is bytes:
        return value
    if type(value) is not str:
        raise _Refused
    if encoding == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            why = f"messages[{position}].body is not valid base64"
            raise _Refused(InvalidRequest(why)) from None
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        why = f"messages[{position}].body is not valid UTF-8 text"
        raise _Refused(InvalidRequest(why)) from None


def _message(m: object, position: int) -> OutgoingMessage:
    if type(m) is not dict or not _MESSAGE_KEYS.issuperset(m):
        raise _Refused
    body = _body(m.get("body"), m.get("encoding", "utf-8"), position)
    if len(m) == 1:  # the body alone: every other field at its default
        return body_only(body)
    headers = _headers(m.get("headers", {}), f"messages[{position}].headers")
    priority = m.get("priority", _PRIORITY.default)
    ttl_ms = m.get("ttl_ms")
    delay_ms = m.get("delay_ms", _DELAY_MS.default)
    dedup_id = m.get("dedup_id")
    if not (
        _PRIORITY.accepts(priority)
        and _TTL_MS.accepts(ttl_ms)
        and _DELAY_MS.accepts(delay_ms)
        and _DEDUP_ID.accepts(dedup_id)
    ):
        raise _Refused
    if dedup_id is not None:
        _text(dedup_id, f"messages[{position}].dedup_id")
    # accepts() checked the types: ints (ttl_ms also None), dedup_id text or None
    return OutgoingMessage(
        body, headers, cast(int, priority), ttl_ms, cast(int, delay_ms), dedup_id
    )


def _publish(payload: object, limits: Limits) -> list[PublishItem]:
    if type(payload) is not dict or len(payload) != 1:
        raise _Refused
    messages = payload.get("messages")
    if type(messages) is not list or len(messages) < _MESSAGES_MIN:
        raise _Refused
    if len(messages) > limits.batch_messages_max:
        why = f"{len(messages)} messages in one batch; at most {limits.batch_messages_max}"
        raise _Refused(MessageTooLarge(why))
    out: list[PublishItem] = []
    total = 0
    for position, m in enumerate(messages):
        fields = len(m) if type(m) is dict else 0
        body = m.get("body") if fields == 1 else None
        if fields == 2:
            # The usual batch writer's message (the Spark connector's rows): a body and
            # a dedup id, every other field at its default, as the engine's
            # ``KeyedItem``. What ``_message`` accepts of it, checked the same way.
            dedup_id = m.get("dedup_id")
            body = m.get("body")
            if type(dedup_id) is str and _DEDUP_ID.accepts(dedup_id):
                if type(body) is str and body.isascii():
                    body = body.encode()
                if type(body) is bytes:
                    _text(dedup_id, f"messages[{position}].dedup_id")
                    total += len(body)
                    out.append((dedup_id, body))
                    continue
            body = None
        if type(body) is bytes:
            # The usual stream message, its body alone as MessagePack bytes: what
            # ``_message`` makes of it (the default encoding takes bytes as they are),
            # as the ``PublishItem`` of such a message: its bytes alone.
            total += len(body)
            out.append(body)
            continue
        if type(body) is str and body.isascii():
            # The usual JSON message, its body alone as ASCII text (utf-8, the default
            # encoding; every other field at its default): its bytes alone, without
            # ``_message``'s calls.
            data = body.encode()
            total += len(data)
            out.append(data)
            continue
        message = _message(m, position)
        total += len(message.body)
        out.append(message)
    if total > limits.batch_bytes_max:
        why = f"{total} body bytes in one batch; at most {limits.batch_bytes_max}"
        raise _Refused(MessageTooLarge(why))
    return out


def publish_items(payload: object, limits: Limits) -> list[PublishItem]:
    """The engine's messages of a ``PublishIn`` body, all or nothing: a message with
    only a body as ASCII text is its bytes (engine/runtime/api.py ``PublishItem``). A
    batch over ``limits`` (messages or body bytes) is 413; the node checks each message
    against its queue's ``max_message_bytes``."""
    try:
        return _publish(payload, limits)
    except _Refused as refused:
        raise _explained(PublishIn, payload, refused.reason) from None


def publish_messages(payload: object, limits: Limits) -> list[OutgoingMessage]:
    """``publish_items``, each message an ``OutgoingMessage``."""
    return [outgoing(m) for m in publish_items(payload, limits)]


# --- receive and settle ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceiveArgs:
    max_messages: int
    wait_ms: int
    lease_ms: int | None
    consumer: str | None
    ack: list[str] | None


def _receive(payload: object) -> ReceiveArgs:
    if type(payload) is not dict or not _RECEIVE_KEYS.issuperset(payload):
        raise _Refused
    args = ReceiveArgs(
        cast(int, payload.get("max_messages", _MAX_MESSAGES.default)),  # checked below
        cast(int, payload.get("wait_ms", _WAIT_MS.default)),
        payload.get("lease_ms"),
        payload.get("consumer"),
        payload.get("ack"),
    )
    if not (
        _MAX_MESSAGES.accepts(args.max_messages)
        and _WAIT_MS.accepts(args.wait_ms)
        and _RECEIVE_LEASE_MS.accepts(args.lease_ms)
        and _CONSUMER.accepts(args.consumer)
        and (args.ack is None or _receipts(args.ack, 0, _ACK_MAX))
    ):
        raise _Refused
    if args.consumer is not None:
        _text(args.consumer, "consumer")
    return args


def receive_args(payload: object) -> ReceiveArgs:
    """The arguments of a ``ReceiveIn`` body, defaults filled in."""
    try:
        return _receive(payload)
    except _Refused as refused:
        raise _explained(ReceiveIn, payload, refused.reason) from None


def _receipts(value: object, count_min: int, count_max: int) -> bool:
    """A list of ``count_min..count_max`` well-formed receipts."""
    if type(value) is not list or not count_min <= len(value) <= count_max:
        return False
    return are_receipt_texts(value)


@dataclass(frozen=True, slots=True)
class SettleArgs:
    receipts: list[str]
    requeue: bool
    lease_ms: int


def _settle(how: str, payload: object) -> SettleArgs:
    if type(payload) is not dict or not _SETTLE_KEYS[how].issuperset(payload):
        raise _Refused
    receipts = payload.get("receipts")
    requeue = payload.get("requeue", _DEFAULT_REQUEUE)
    lease_ms = payload.get("lease_ms", 0)
    if (
        not _receipts(receipts, _RECEIPTS_MIN, _RECEIPTS_MAX)
        or type(requeue) is not bool
        or (how == "extend" and not _EXTEND_LEASE_MS.accepts(lease_ms))
    ):
        raise _Refused
    return SettleArgs(cast(list[str], receipts), requeue, lease_ms)


def settle_args(how: str, payload: object) -> SettleArgs:
    """The arguments of an ack (``SettleIn``), nack (``NackIn``) or extend (``ExtendIn``)
    body; ``requeue`` is the default where the body has none."""
    try:
        return _settle(how, payload)
    except _Refused as refused:
        raise _explained(SETTLE_MODELS[how], payload, refused.reason) from None
