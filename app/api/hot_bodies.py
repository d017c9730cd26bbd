"""Request bodies of the hot message endpoints (publish, receive, ack, nack, extend),
checked without pydantic.

Rule: these parsers only *accept*. ``None`` means "not this way": the request then goes
to the FastAPI route, whose pydantic model gives the answer (400, 413 or 422 with its
errors), so error answers have one source. A body accepted here is one the model accepts
too, with the same values: the bounds are read from the models' JSON schema (what the
OpenAPI document states), and tests/app/test_hot_paths.py checks both against each
other. Types are checked exactly (``type(x) is int``), as the models are strict: ``"5"``,
``5.0`` and ``true`` are no integer, bytes no text, on either path.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel

from app.api.queue_schemas import ExtendIn, MessageIn, NackIn, PublishIn, ReceiveIn, SettleIn
from engine.limits import Limits
from engine.runtime.api import OutgoingMessage

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


_MESSAGE_KEYS = frozenset(_properties(MessageIn))
_ENCODINGS = frozenset(_properties(MessageIn)["encoding"]["enum"])
_PRIORITY = int_field(MessageIn, "priority")
_TTL_MS = int_field(MessageIn, "ttl_ms")
_DELAY_MS = int_field(MessageIn, "delay_ms")
_DEDUP_ID = text_field(MessageIn, "dedup_id")
_MESSAGES_MIN = _properties(PublishIn)["messages"]["minItems"]
_RECEIVE_KEYS = frozenset(_properties(ReceiveIn))
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
_SETTLE_KEYS = {
    "ack": frozenset(_properties(SettleIn)),
    "nack": frozenset(_properties(NackIn)),
    "extend": frozenset(_properties(ExtendIn)),
}
_EXTEND_LEASE_MS = int_field(ExtendIn, "lease_ms")
_DEFAULT_REQUEUE = _properties(NackIn)["requeue"]["default"]
assert _RECEIPTS_MIN >= 1 and _MESSAGES_MIN >= 1
assert (
    _receipts_field(NackIn)[:2] == _receipts_field(ExtendIn)[:2] == (_RECEIPTS_MIN, _RECEIPTS_MAX)
)


# --- publish -----------------------------------------------------------------------


def _is_text(value: str) -> bool:
    """JSON may carry lone surrogates, which are no UTF-8 (the route answers 400)."""
    return value.isascii() or _encodes(value)


def _encodes(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _headers(value: object) -> dict[str, str] | None:
    if type(value) is not dict:
        return None
    for k, v in value.items():
        if type(k) is not str or type(v) is not str or not (_is_text(k) and _is_text(v)):
            return None
    return value


def _body(value: object, encoding: object) -> bytes | None:
    if type(value) is bytes:
        return value
    if type(value) is not str:
        return None
    if encoding == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _message(m: object) -> OutgoingMessage | None:
    if type(m) is not dict or not _MESSAGE_KEYS.issuperset(m):
        return None
    encoding = m.get("encoding", "utf-8")
    body = (
        _body(m.get("body"), encoding) if type(encoding) is str and encoding in _ENCODINGS else None
    )
    if body is None:
        return None
    if len(m) == 1:  # the body alone: every other field at its default
        return OutgoingMessage(body, {}, 0, None, 0, None)
    headers = _headers(m.get("headers", {}))
    priority = m.get("priority", _PRIORITY.default)
    ttl_ms = m.get("ttl_ms")
    delay_ms = m.get("delay_ms", _DELAY_MS.default)
    dedup_id = m.get("dedup_id")
    if (
        headers is None
        or not _PRIORITY.accepts(priority)
        or not _TTL_MS.accepts(ttl_ms)
        or not _DELAY_MS.accepts(delay_ms)
        or not _DEDUP_ID.accepts(dedup_id)
        or (dedup_id is not None and not _is_text(dedup_id))
    ):
        return None
    # accepts() checked the types: ints (ttl_ms also None), dedup_id text or None
    return OutgoingMessage(
        body, headers, cast(int, priority), ttl_ms, cast(int, delay_ms), dedup_id
    )


def publish_messages(payload: object, limits: Limits) -> list[OutgoingMessage] | None:
    """The engine's messages of a ``PublishIn`` body, or None (the route decides)."""
    if type(payload) is not dict or len(payload) != 1:
        return None
    messages = payload.get("messages")
    if (
        type(messages) is not list
        or not _MESSAGES_MIN <= len(messages) <= limits.batch_messages_max
    ):
        return None
    out: list[OutgoingMessage] = []
    total = 0
    for m in messages:
        message = _message(m)
        if message is None:
            return None
        total += len(message.body)
        out.append(message)
    if total > limits.batch_bytes_max:
        return None
    return out


# --- receive and settle ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReceiveArgs:
    max_messages: int
    wait_ms: int
    lease_ms: int | None
    consumer: str | None
    ack: list[str] | None


def receive_args(payload: object) -> ReceiveArgs | None:
    if type(payload) is not dict or not _RECEIVE_KEYS.issuperset(payload):
        return None
    args = ReceiveArgs(
        cast(int, payload.get("max_messages", _MAX_MESSAGES.default)),  # checked below
        cast(int, payload.get("wait_ms", _WAIT_MS.default)),
        payload.get("lease_ms"),
        payload.get("consumer"),
        payload.get("ack"),
    )
    if (
        _MAX_MESSAGES.accepts(args.max_messages)
        and _WAIT_MS.accepts(args.wait_ms)
        and _RECEIVE_LEASE_MS.accepts(args.lease_ms)
        and _CONSUMER.accepts(args.consumer)
        and (args.ack is None or _receipts(args.ack, 0, _ACK_MAX))
    ):
        return args
    return None


def _receipts(value: object, count_min: int, count_max: int) -> bool:
    """A list of ``count_min..count_max`` well-formed receipts."""
    if type(value) is not list or not count_min <= len(value) <= count_max:
        return False
    match = _RECEIPT.fullmatch
    return all(type(r) is str and match(r) is not None for r in value)


@dataclass(frozen=True, slots=True)
class SettleArgs:
    receipts: list[str]
    requeue: bool
    lease_ms: int


def settle_args(how: str, payload: object) -> SettleArgs | None:
    """``how``: ack, nack or extend."""
    if type(payload) is not dict or not _SETTLE_KEYS[how].issuperset(payload):
        return None
    receipts = payload.get("receipts")
    if not _receipts(receipts, _RECEIPTS_MIN, _RECEIPTS_MAX):
        return None
    requeue = payload.get("requeue", _DEFAULT_REQUEUE)
    if type(requeue) is not bool:
        return None
    lease_ms = payload.get("lease_ms", 0)
    if how == "extend" and not _EXTEND_LEASE_MS.accepts(lease_ms):
        return None
    return SettleArgs(cast(list[str], receipts), requeue, lease_ms)
