"""The one parser of message bodies (app/api/message_bodies.py) against the models the
OpenAPI document states (app/api/queue_schemas.py): the same bodies accepted, with the
same values, and the same refused, with the same status (422 from the schema first,
then the parser's own 400 and 413), in both directions. The reference here reads a body
the slow way, with pydantic, as the routes did before the parser was the only one.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

import msgpack
import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from app.api import message_bodies
from app.api.message_bodies import (
    BODY_FIELDS,
    ReceiveArgs,
    SettleArgs,
    UnexplainedRefusal,
    decoded,
    publish_items,
    publish_messages,
    receive_args,
    settle_args,
)
from app.api.message_route import MessageRoute
from app.api.queue_schemas import ExtendIn, MessageIn, NackIn, PublishIn, ReceiveIn, SettleIn
from app.main import create_app
from app.settings import Settings
from engine.errors import InvalidRequest, QuorraError
from engine.limits import DEFAULT_LIMITS, Limits
from engine.queue.receipts import RECEIPT_CHARS
from engine.runtime.api import OutgoingMessage, body_only, outgoing

SMALL_LIMITS = dataclasses.replace(
    DEFAULT_LIMITS,
    batch_messages_max=2,
    batch_bytes_max=8,
    message_bytes_max=8,
    message_bytes_max_ceiling=8,
)
"""Small enough for random batches to cross both batch limits (413)."""

Outcome = object
"""The parsed value, or the status of the refusal."""


def parsed(parse: Any, *args: Any) -> Outcome:
    try:
        return parse(*args)
    except UnexplainedRefusal as e:
        raise AssertionError(f"the parser refused what the schema accepts: {e}") from None
    except RequestValidationError:
        return 422
    except QuorraError as e:
        return e.status


# --- the fields ------------------------------------------------------------------


def test_the_parser_reads_exactly_the_schemas_fields(tmp_path: Any) -> None:
    """A field added to a model must be parsed (or refused) by the parser too: the
    parser's field sets are the models', and every message route's body is covered."""
    for model, fields in BODY_FIELDS.items():
        assert frozenset(model.model_fields) == fields, model.__name__
    assert PublishIn.model_fields["messages"].annotation == list[MessageIn]
    app = create_app(Settings(data_dir=tmp_path / "data"))
    documented = {
        route.body_field.field_info.annotation
        for route in app.router.routes
        if isinstance(route, MessageRoute) and route.body_field is not None
    }
    assert documented == {PublishIn, ReceiveIn, SettleIn, NackIn, ExtendIn}
    assert documented | {MessageIn} == set(BODY_FIELDS)


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (PublishIn, {"messages": [{"body": "x", "urgent": True}]}),
        (ReceiveIn, {"max_messages": 1, "urgent": True}),
        (SettleIn, {"receipts": ["0" * RECEIPT_CHARS], "urgent": True}),
    ],
)
def test_a_field_the_schema_lacks_is_refused_not_dropped(
    model: type[BaseModel], body: dict[str, Any]
) -> None:
    parse = {
        PublishIn: lambda b: publish_messages(b, DEFAULT_LIMITS),
        ReceiveIn: receive_args,
        SettleIn: lambda b: settle_args("ack", b),
    }[model]
    with pytest.raises(RequestValidationError) as refused:
        parse(body)
    assert [e["type"] for e in refused.value.errors()] == ["extra_forbidden"]


# --- the reference: pydantic, then the checks the schema cannot state ------------------


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reference_body(m: MessageIn) -> bytes | int:
    if isinstance(m.body, bytes):
        return m.body
    if m.encoding == "base64":
        try:
            return base64.b64decode(m.body, validate=True)
        except (binascii.Error, ValueError):
            return 400
    return m.body.encode("utf-8") if _utf8(m.body) else 400


def reference_publish(payload: object, limits: Limits) -> Outcome:
    try:
        batch = PublishIn.model_validate(payload)
    except ValidationError:
        return 422
    if len(batch.messages) > limits.batch_messages_max:
        return 413
    out = []
    for m in batch.messages:
        body = _reference_body(m)
        texts = [*m.headers.keys(), *m.headers.values(), m.dedup_id or ""]
        if isinstance(body, int) or not all(_utf8(t) for t in texts):
            return 400
        out.append(OutgoingMessage(body, m.headers, m.priority, m.ttl_ms, m.delay_ms, m.dedup_id))
    if sum(len(m.body) for m in out) > limits.batch_bytes_max:
        return 413
    return out


def reference_receive(payload: object) -> Outcome:
    try:
        r = ReceiveIn.model_validate(payload)
    except ValidationError:
        return 422
    if r.consumer is not None and not _utf8(r.consumer):
        return 400
    return ReceiveArgs(r.max_messages, r.wait_ms, r.lease_ms, r.consumer, r.ack)


def reference_settle(how: str, payload: object) -> Outcome:
    model = message_bodies.SETTLE_MODELS[how]
    try:
        s = model.model_validate(payload)
    except ValidationError:
        return 422
    if isinstance(s, NackIn):
        return SettleArgs(s.receipts, s.requeue, 0)
    if isinstance(s, ExtendIn):
        return SettleArgs(s.receipts, True, s.lease_ms)
    assert isinstance(s, SettleIn)
    return SettleArgs(s.receipts, True, 0)


# --- random bodies -------------------------------------------------------------------

_INTS = st.one_of(
    st.integers(min_value=-3, max_value=12),
    st.sampled_from([2**31, 2**62, 10**30, 315360000000, 315360000001, 2592000000, 2592000001]),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.none(),
)
_TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["\ud800", "a\udfff", "é"]),  # lone surrogates: JSON can carry them
    st.binary(max_size=8),
    st.integers(),
    st.none(),
)
_ODD_MESSAGE = st.dictionaries(
    st.sampled_from(["body", "encoding", "headers", "priority", "ttl_ms", "dedup_id", "x"]),
    st.one_of(_INTS, _TEXT, st.dictionaries(st.text(max_size=2), _TEXT, max_size=2)),
    max_size=5,
)
_MESSAGE = st.fixed_dictionaries(
    {
        "body": st.one_of(
            st.text(max_size=6),
            st.binary(max_size=6),
            st.sampled_from(["aGk=", "%%", "\ud800"]),
        )
    },
    optional={
        "encoding": st.one_of(st.sampled_from(["utf-8", "base64", "latin-1"]), _TEXT),
        "headers": st.one_of(
            st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
            st.dictionaries(st.text(max_size=2), _TEXT, max_size=2),
        ),
        "priority": st.one_of(st.integers(0, 9), _INTS),
        "ttl_ms": st.one_of(st.integers(0, 10), _INTS),
        "delay_ms": st.one_of(st.integers(0, 10), _INTS),
        "dedup_id": st.one_of(st.text(max_size=3), _TEXT),
    },
)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.lists(_MESSAGE, min_size=1, max_size=3),
        st.lists(st.one_of(_MESSAGE, _ODD_MESSAGE), max_size=3),
        _INTS,
    ),
    st.sampled_from([DEFAULT_LIMITS, SMALL_LIMITS]),
    st.booleans(),
)
@example(
    [{"body": "x"}, {"body": "aGk=", "encoding": "base64", "headers": {"a": "b"}}], None, False
)
@example(
    [{"body": b"x", "priority": 9, "ttl_ms": 0, "delay_ms": 2592000000, "dedup_id": "d"}],
    None,
    False,
)
@example([{"body": b"x"}, {"body": b""}, {"body": b"\xff", "encoding": "base64"}], None, False)
@example([{"body": "%%", "encoding": "base64"}, {"body": 1}], None, False)
@example([{"body": "x", "headers": {"k": "\ud800"}}], None, False)
@example([{"body": "abcde"}, {"body": "fghij"}], SMALL_LIMITS, False)
@example(None, None, True)
def test_the_publish_parser_is_the_schema(messages: Any, limits: Limits | None, bare: bool) -> None:
    limits = limits or DEFAULT_LIMITS
    payload = messages if bare else {"messages": messages}
    assert parsed(publish_messages, payload, limits) == reference_publish(payload, limits)
    # The route's items are the same messages, a message of defaults as its body alone.
    assert _whole(parsed(publish_items, payload, limits)) == reference_publish(payload, limits)


def _whole(outcome: Any) -> Any:
    """``publish_items``'s outcome with each ``bytes`` or (dedup id, body) item the
    message it stands for."""
    if not isinstance(outcome, list):
        return outcome
    return [outgoing(m) for m in outcome]


def test_a_message_of_ascii_text_alone_is_its_bytes() -> None:
    """What the publish route hands the engine: no ``OutgoingMessage`` for the usual
    message, and one for any other."""
    payload = {"messages": [{"body": "plain"}, {"body": "h\u00e9"}, {"body": "x", "priority": 2}]}
    assert publish_items(payload, DEFAULT_LIMITS) == [
        b"plain",
        OutgoingMessage("hé".encode()),
        OutgoingMessage(b"x", priority=2),
    ]


def test_a_body_with_a_dedup_id_alone_is_a_pair() -> None:
    """A batch writer's message (a body and a dedup id) reaches the engine as the pair
    (dedup id, body); a non-ASCII text body or any other field makes it a message."""
    payload = {
        "messages": [
            {"body": b"\x00", "dedup_id": "a"},
            {"body": "text", "dedup_id": "b"},
            {"body": "h\u00e9", "dedup_id": "c"},
            {"body": "x", "dedup_id": "d", "priority": 1},
        ]
    }
    assert publish_items(payload, DEFAULT_LIMITS) == [
        ("a", b"\x00"),
        ("b", b"text"),
        OutgoingMessage("hé".encode(), dedup_id="c"),
        OutgoingMessage(b"x", priority=1, dedup_id="d"),
    ]


@given(st.binary(max_size=8))
def test_a_body_alone_is_the_message_of_its_body(body: bytes) -> None:
    message = body_only(body)
    assert message == OutgoingMessage(body)
    assert message.body is body
    assert message.headers is not body_only(body).headers  # each its own, as the default
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.priority = 1  # type: ignore[misc]


_RECEIPT = st.one_of(
    st.from_regex(rf"[0-9a-f]{{{RECEIPT_CHARS}}}", fullmatch=True),
    st.text(
        alphabet="0123456789abcdefABCDEF\n", min_size=RECEIPT_CHARS - 1, max_size=RECEIPT_CHARS + 1
    ),
    st.integers(),
    st.binary(),
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.dictionaries(
            st.sampled_from(["max_messages", "wait_ms", "lease_ms", "consumer", "ack", "x"]),
            st.one_of(
                _INTS,
                _TEXT,
                st.sampled_from([1000, 1001, 20000, 20001, 43200000, 43200001]),
                st.lists(_RECEIPT, max_size=3),
            ),
            max_size=4,
        ),
        _INTS,
    )
)
@example({"max_messages": 1000, "wait_ms": 20000, "lease_ms": 1, "consumer": "c"})
@example({"ack": []})
@example({"ack": None, "max_messages": 5})
@example({"ack": ["0" * RECEIPT_CHARS, "f" * RECEIPT_CHARS]})
@example({"consumer": "\ud800"})
@example(None)
def test_the_receive_parser_is_the_schema(payload: Any) -> None:
    assert parsed(receive_args, payload) == reference_receive(payload)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["ack", "nack", "extend"]),
    st.fixed_dictionaries(
        {"receipts": st.lists(_RECEIPT, min_size=1, max_size=3)},
        optional={"requeue": st.one_of(st.booleans(), _INTS), "lease_ms": _INTS},
    )
    | st.dictionaries(
        st.sampled_from(["receipts", "requeue", "lease_ms", "x"]),
        st.one_of(st.lists(_RECEIPT, min_size=0, max_size=3), st.booleans(), _INTS),
        max_size=3,
    )
    | _INTS,
)
@example("extend", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 43200000})
@example("nack", {"receipts": ["0" * RECEIPT_CHARS, "f" * RECEIPT_CHARS], "requeue": False})
@example("ack", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 5})
def test_the_settle_parsers_are_the_schemas(how: str, payload: Any) -> None:
    assert parsed(settle_args, how, payload) == reference_settle(how, payload)


# --- bytes to values ---------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)  # beyond: test_integers_beyond_64_bits_...
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_json_and_msgpack_read_the_same_values(value: Any) -> None:
    as_json = json.dumps(value).encode()
    assert decoded("application/json", as_json) == json.loads(as_json)
    assert decoded("application/msgpack", msgpack.packb(value)) == value


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"body": "x"}], "messages": [{"body": "y"}]}',
        b'{"messages": [{"body": "\\u00e9\\u2028\\ud83d\\ude00"}]}',
        b'\xef\xbb\xbf{"messages": [{"body": "x"}]}',
        b'{"messages": [{"body": "x", "ttl_ms": 1e400}]}',
        b'{"messages": [{"body": "x", "delay_ms": NaN}]}',
        b'{"messages": [{"body": "\\ud800"}]}',
    ],
)
def test_what_orjson_refuses_the_standard_library_reads(raw: bytes) -> None:
    assert repr(decoded("application/json", raw)) == repr(json.loads(raw))


def test_integers_beyond_64_bits_are_refused_either_way() -> None:
    raw = b'{"messages": [{"body": "x", "priority": 18446744073709551616}]}'
    value = decoded("application/json", raw)
    assert parsed(publish_messages, value, DEFAULT_LIMITS) == 422
    assert reference_publish(json.loads(raw), DEFAULT_LIMITS) == 422


@pytest.mark.parametrize(
    "raw", [b'{"messages": [{"body": "x"}', b'{"messages": [{"body": "\xff"}]}', b"{,}"]
)
def test_what_neither_reads_is_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        decoded("application/json", raw)
