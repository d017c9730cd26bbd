"""Integer fields of request bodies take integers only: ``"1"``, ``1.0`` and ``true`` are
422 on every endpoint, in JSON and in MessagePack, whether the message bodies' parser
(app/api/message_bodies.py) or a route's model reads the body. The fields are read from
the models, so a field added later is checked too."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
import pytest
from pydantic import BaseModel

from app.api.queue_schemas import (
    CompactionIn,
    ExtendIn,
    MessageIn,
    QueueArgsIn,
    QueuePatch,
    ReceiveIn,
)
from tests.app.api.conftest import MSGPACK, assert_problem, new_queue

pytestmark = pytest.mark.integration

NOT_INTEGERS = ("1", 1.0, True)


def integer_fields(model: type[BaseModel]) -> list[str]:
    fields = []
    for name, prop in model.model_json_schema()["properties"].items():
        kinds = [p.get("type") for p in prop.get("anyOf", [prop])]
        if "integer" in kinds or any(isinstance(v, int) for v in prop.get("enum", [])):
            fields.append(name)
    return fields


def _receipt(admin: httpx.Client, queue: str) -> str:
    admin.post(f"/api/v1/queues/{queue}/messages", json={"messages": [{"body": "x"}]})
    got = admin.post(f"/api/v1/queues/{queue}/messages/receive", json={"max_messages": 1})
    receipt: str = got.json()["messages"][0]["receipt"]
    return receipt


Request = tuple[str, str, dict[str, Any], Callable[[dict[str, Any], Any], None]]
"""method, path, a valid body, how to set the field in it."""


def _top(field: str) -> Callable[[dict[str, Any], Any], None]:
    return lambda body, value: body.__setitem__(field, value)


def _in_message(field: str) -> Callable[[dict[str, Any], Any], None]:
    return lambda body, value: body["messages"][0].__setitem__(field, value)


ENDPOINTS: list[tuple[str, type[BaseModel]]] = [
    ("publish", MessageIn),
    ("receive", ReceiveIn),
    ("extend", ExtendIn),
    ("create", QueueArgsIn),
    ("patch", QueuePatch),
    ("compact", CompactionIn),
]
CASES = [(endpoint, field) for endpoint, model in ENDPOINTS for field in integer_fields(model)]


def request_for(admin: httpx.Client, endpoint: str, field: str) -> Request:
    queue = new_queue(admin, "strict")
    messages = f"/api/v1/queues/{queue}/messages"
    if endpoint == "publish":
        return "POST", messages, {"messages": [{"body": "x"}]}, _in_message(field)
    if endpoint == "receive":
        return "POST", f"{messages}/receive", {}, _top(field)
    if endpoint == "extend":
        body = {"receipts": [_receipt(admin, queue)], "lease_ms": 1000}
        return "POST", f"{messages}/extend", body, _top(field)
    if endpoint == "create":
        return "PUT", f"/api/v1/queues/strict-{secrets.token_hex(4)}", {}, _top(field)
    if endpoint == "patch":
        return "PATCH", f"/api/v1/queues/{queue}", {}, _top(field)
    assert endpoint == "compact"
    return "POST", f"/api/v1/queues/{queue}/compactions", {}, _top(field)


def test_every_model_has_the_integer_fields_known_today() -> None:
    assert {
        ("publish", "priority"),
        ("publish", "ttl_ms"),
        ("publish", "delay_ms"),
        ("receive", "max_messages"),
        ("receive", "wait_ms"),
        ("receive", "lease_ms"),
        ("extend", "lease_ms"),
        ("create", "replicas"),
        ("create", "max_length"),
        ("create", "message_ttl_ms"),
        ("patch", "delivery_limit"),
        ("compact", "phase"),
    } <= set(CASES)


@pytest.mark.parametrize(("endpoint", "field"), CASES)
@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_an_integer_field_refuses_text_decimals_and_booleans(
    admin: httpx.Client, endpoint: str, field: str, encoding: str
) -> None:
    method, path, valid, put = request_for(admin, endpoint, field)
    for value in NOT_INTEGERS:
        body = {k: ([dict(m) for m in v] if k == "messages" else v) for k, v in valid.items()}
        put(body, value)
        if encoding == "json":
            response = admin.request(method, path, json=body)
        else:
            headers = {"Content-Type": MSGPACK}
            response = admin.request(method, path, content=msgpack.packb(body), headers=headers)
        problem = assert_problem(response, 422, "validation-failed")
        assert [e["loc"][-1] for e in problem["errors"]] == [field], (value, problem)
