"""The message endpoints as ``MessageRoute``s reached through ``MessageDispatch``
(app/api/message_route.py): inside every middleware (security headers, request metrics
under the route's template, the body limit, the name guard, the leader header), their
bodies read by the one parser (app/api/message_bodies.py), their refusals rendered by the
app's problem handlers.

In process, one app with the real engine. Every request is sent twice: through the app
as it is, and through the same app built without ``MessageDispatch`` (the router finds
the same routes), and the two answers must agree: status, the headers a client acts on,
and the body when the request changes nothing. tests/app/test_message_bodies.py holds
the parser's properties against the models.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.message_route import MessageDispatch, MessageRoute
from app.main import ResponseHeadersMiddleware, create_app
from app.settings import Settings
from engine.queue.receipts import RECEIPT_CHARS

with warnings.catch_warnings():
    # Starlette's test client asks for httpx2, which this project does not install.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PASSWORD = "message-route-password"
MSGPACK = "application/msgpack"
PROBLEM = "application/problem+json"
MESSAGES = "/api/v1/queues/{name}/messages"
SECURITY_HEADERS = {k.decode(): v.decode() for k, v in ResponseHeadersMiddleware.HEADERS}
COMPARED_HEADERS = ("content-type", "retry-after", "www-authenticate", "quorra-leader")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    data_dir: Path = tmp_path_factory.mktemp("routes") / "data"
    yield create_app(Settings(data_dir=data_dir, admin_password=PASSWORD, node_name="n1"))


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://127.0.0.1") as c:
        token = c.post("/api/v1/tokens", auth=("admin", PASSWORD)).json()["token"]
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


class Paths:
    """The app's middleware stack with the dispatch (``fast``) and without (``routed``)."""

    def __init__(self, app: FastAPI, client: TestClient) -> None:
        self.app, self.client = app, client
        self.fast = app.build_middleware_stack()
        kept = app.user_middleware
        app.user_middleware = [m for m in kept if m.cls is not MessageDispatch]
        assert len(app.user_middleware) == len(kept) - 1
        self.routed = app.build_middleware_stack()
        app.user_middleware = kept

    def send(self, fast: bool, path: str, **kwargs: Any) -> Any:
        self.app.middleware_stack = self.fast if fast else self.routed
        try:
            return self.client.post(path, **kwargs)
        finally:
            self.app.middleware_stack = self.fast

    def both(self, path: str, **kwargs: Any) -> tuple[Any, Any]:
        fast = self.send(True, path, **kwargs)
        routed = self.send(False, path, **kwargs)
        assert fast.status_code == routed.status_code, (fast.text, routed.text)
        for name in (*COMPARED_HEADERS, *SECURITY_HEADERS):
            assert fast.headers.get(name) == routed.headers.get(name), name
        return fast, routed

    def same(self, path: str, **kwargs: Any) -> Any:
        """``both``, for requests that change nothing: the bodies are equal too."""
        fast, routed = self.both(path, **kwargs)
        assert fast.content == routed.content
        return fast


@pytest.fixture(scope="module")
def paths(app: FastAPI, client: TestClient) -> Paths:
    return Paths(app, client)


def _queue(client: TestClient, name: str, **arguments: Any) -> str:
    response = client.put(f"/api/v1/queues/{name}", json=arguments)
    assert response.status_code in (200, 201), response.text
    return name


def _body(response: Any) -> Any:
    if response.headers.get("content-type") == MSGPACK:
        return msgpack.unpackb(response.content)
    return json.loads(response.content)


def refused(response: Any, status: int, problem: str) -> dict[str, Any]:
    """A problem answer, with the headers the middlewares add to every answer."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    for name, value in SECURITY_HEADERS.items():
        assert response.headers[name] == value, name
    body: dict[str, Any] = response.json()
    assert body["type"] == f"/problems/{problem}", body
    return body


# --- where the routes are ----------------------------------------------------------


def test_the_message_routes_come_first_and_are_message_routes(app: FastAPI) -> None:
    routes = app.router.routes
    posts = [r for r in routes if isinstance(r, APIRoute) and r.methods == {"POST"}]
    messages = [r for r in posts if r.path.startswith(MESSAGES)]
    assert [r.path.removeprefix(MESSAGES) for r in messages] == [
        "",
        "/receive",
        "/ack",
        "/nack",
        "/extend",
    ]
    assert all(isinstance(r, MessageRoute) for r in messages)
    assert routes[: len(messages)] == messages
    assert not [r for r in routes if isinstance(r, MessageRoute) and r not in messages]


def test_the_dispatch_answers_without_the_router(
    paths: Paths, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = _queue(client, "dispatched")

    async def no_router(*_args: Any) -> None:
        raise AssertionError("the router handled a message request")

    monkeypatch.setattr(MessageRoute, "handle", no_router)
    answer = paths.send(True, f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})
    assert answer.status_code == 201
    refused(paths.send(True, f"/api/v1/queues/{q}/messages/ack", json={}), 422, "validation-failed")
    with pytest.raises(AssertionError, match="the router handled"):
        paths.send(False, f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]})


def test_openapi_still_describes_the_bodies_and_the_token(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    for suffix, model in [
        ("", "PublishIn"),
        ("/receive", "ReceiveIn"),
        ("/ack", "SettleIn"),
        ("/nack", "NackIn"),
        ("/extend", "ExtendIn"),
    ]:
        operation = document["paths"][MESSAGES + suffix]["post"]
        body = operation["requestBody"]
        assert body["required"] is True
        assert {k: v["schema"] for k, v in body["content"].items()} == {
            "application/json": {"$ref": f"#/components/schemas/{model}"},
            MSGPACK: {"$ref": f"#/components/schemas/{model}"},
        }
        assert model in document["components"]["schemas"]
        assert operation["security"] == [{"HTTPBearer": []}]
        assert [p["name"] for p in operation["parameters"]] == ["name"]


# --- refusals, rendered by the app's handlers ----------------------------------------

BAD_PUBLISHES = [
    ({"messages": []}, 422),
    ({"messages": [{"body": "x", "priority": -1}]}, 422),
    ({"messages": [{"body": "x", "priority": True}]}, 422),
    ({"messages": [{"body": "x", "ttl_ms": -5}]}, 422),
    ({"messages": [{"body": "x", "encoding": {}}]}, 422),
    ({"messages": [{"body": "x", "headers": {"a": 1}}]}, 422),
    ({"messages": [{"body": "x", "surprise": 1}]}, 422),
    ({"messages": [{"body": "%%%", "encoding": "base64"}]}, 400),
    ({"messages": [{"body": "x"}] * 1001}, 413),
    # A schema error anywhere comes before the parser's own reasons (400, 413).
    ({"messages": [{"body": "%%%", "encoding": "base64"}, {"body": 1}]}, 422),
    ({"messages": [{"body": "x"}] * 1000 + [{"body": "x", "priority": -1}]}, 422),
    ({"messages": [{"body": "x"}], "more": 1}, 422),
    ([1, 2], 422),
    (None, 422),
]
PROBLEM_TYPES = {400: "invalid-request", 413: "message-too-large", 422: "validation-failed"}


@pytest.mark.parametrize(("payload", "status"), BAD_PUBLISHES)
def test_invalid_publishes_are_refused(
    paths: Paths, client: TestClient, payload: Any, status: int
) -> None:
    q = _queue(client, "bad-publish")
    response = paths.same(f"/api/v1/queues/{q}/messages", json=payload)
    problem = refused(response, status, PROBLEM_TYPES[status])
    if status == 422:
        assert problem["errors"] and all(e["loc"][0] == "body" for e in problem["errors"])
    assert client.get(f"/api/v1/queues/{q}").json()["stats"]["messages_ready"] == 0


def test_a_schema_error_names_the_field(paths: Paths, client: TestClient) -> None:
    q = _queue(client, "bad-field")
    payload = {"messages": [{"body": "x"}, {"body": "y", "priority": "high"}]}
    problem = refused(
        paths.same(f"/api/v1/queues/{q}/messages", json=payload), 422, "validation-failed"
    )
    assert [e["loc"] for e in problem["errors"]] == [["body", "messages", "1", "priority"]]
    empty = refused(paths.same(f"/api/v1/queues/{q}/messages/receive"), 422, "validation-failed")
    assert empty["errors"] == [{"loc": ["body"], "msg": "Field required", "type": "missing"}]


@pytest.mark.parametrize(
    ("content", "content_type", "status", "problem"),
    [
        (b'{"messages": [{"body": "x"}', "application/json", 400, "invalid-request"),
        (b'{"messages": [{"body": "\\ud800"}]}', "application/json", 400, "invalid-request"),
        (b'{"messages": [{"body": "\xff"}]}', "application/json", 400, "invalid-request"),
        (
            b'{"messages": [{"body": "x", "delay_ms": NaN}]}',
            "application/json",
            422,
            "validation-failed",
        ),
        (b"", "application/json", 422, "validation-failed"),
        (b"\xc1\xff\x00", MSGPACK, 400, "invalid-request"),
        (
            msgpack.packb({"messages": [{"body": b"x", "priority": 2**40}]}),
            MSGPACK,
            422,
            "validation-failed",
        ),
        (b"body=x", "application/x-www-form-urlencoded", 415, "unsupported-media-type"),
        (b'{"messages": [{"body": "x"}]}', "text/plain", 415, "unsupported-media-type"),
    ],
)
def test_malformed_bodies_are_refused(
    paths: Paths, client: TestClient, content: bytes, content_type: str, status: int, problem: str
) -> None:
    q = _queue(client, "malformed")
    headers = {"Content-Type": content_type}
    response = paths.same(f"/api/v1/queues/{q}/messages", content=content, headers=headers)
    refused(response, status, problem)


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b'\xef\xbb\xbf{"messages": [{"body": "x"}]}', "application/json"),
        (b'{"messages": [{"body": "x"}]}', "application/vnd.api+json"),
        (b'{"messages": [{"body": "x"}]}', ""),
        (msgpack.packb({"messages": [{"body": b"x"}]}), "application/x-msgpack"),
    ],
)
def test_json_the_standard_library_reads_and_other_media_types(
    paths: Paths, client: TestClient, content: bytes, content_type: str
) -> None:
    q = _queue(client, "media")
    headers = {"Content-Type": content_type}
    response, _ = paths.both(f"/api/v1/queues/{q}/messages", content=content, headers=headers)
    assert response.status_code == 201, response.text


def test_oversize_bodies_are_413_from_the_body_limit(
    paths: Paths, app: FastAPI, client: TestClient
) -> None:
    q = _queue(client, "oversize")
    limit = app.state.settings.request_body_bytes_max
    declared = paths.same(
        f"/api/v1/queues/{q}/messages",
        content=b"{}",
        headers={"Content-Type": "application/json", "Content-Length": str(limit + 1)},
    )
    refused(declared, 413, "message-too-large")

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"body": "'
        yield b"x" * limit
        yield b'"}]}'

    for fast in (True, False):
        chunked = paths.send(fast, f"/api/v1/queues/{q}/messages", content=chunks())
        refused(chunked, 413, "message-too-large")


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Bearer qra_not-a-token", "Basic YWRtaW46eA=="]
)
def test_missing_or_invalid_tokens_are_401(
    paths: Paths, client: TestClient, authorization: str | None
) -> None:
    q = _queue(client, "auth")
    headers = {"Authorization": authorization or ""}
    for suffix, payload in [("", {"messages": [{"body": "x"}]}), ("/receive", {})]:
        response = paths.same(f"/api/v1/queues/{q}/messages{suffix}", json=payload, headers=headers)
        refused(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == 'Bearer realm="quorra"'


def test_permissions_are_the_queues(paths: Paths, client: TestClient) -> None:
    _queue(client, "orders.eu")
    _queue(client, "secret")
    made = client.post(
        "/api/v1/users",
        json={"name": "app", "password": "app-password", "permissions": {"write": "orders\\..*"}},
    )
    assert made.status_code == 201, made.text
    token = client.post("/api/v1/tokens", auth=("app", "app-password")).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    message = {"messages": [{"body": "x"}]}
    denied = paths.same("/api/v1/queues/secret/messages", json=message, headers=headers)
    refused(denied, 403, "forbidden")
    read = paths.same("/api/v1/queues/orders.eu/messages/receive", json={}, headers=headers)
    refused(read, 403, "forbidden")
    allowed, _ = paths.both("/api/v1/queues/orders.eu/messages", json=message, headers=headers)
    assert allowed.status_code == 201


@pytest.mark.parametrize(
    ("suffix", "payload"),
    [
        ("/receive", {"max_messages": 0}),
        ("/receive", {"wait_ms": 10**9}),
        ("/receive", {"max_messages": "5"}),  # strict: text is no integer
        ("/receive", {"consumer": ""}),
        ("/receive", {"surprise": 1}),
        ("/receive", {"ack": ["XYZ"]}),
        ("/receive", {"ack": "0" * RECEIPT_CHARS}),
        ("/receive", {"ack": ["0" * RECEIPT_CHARS] * 1001}),
        ("/ack", {"receipts": []}),
        ("/ack", {"receipts": ["XYZ"]}),
        ("/ack", {"receipts": ["0" * RECEIPT_CHARS + "\n"]}),
        ("/nack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": "yes"}),  # strict: no boolean
        ("/nack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": []}),
        ("/extend", {"receipts": ["0" * RECEIPT_CHARS]}),
        ("/extend", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 0}),
        ("/ack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": True}),  # nack's field
    ],
)
def test_invalid_receives_and_settles_are_422(
    paths: Paths, client: TestClient, suffix: str, payload: Any
) -> None:
    q = _queue(client, "settle-bad")
    response = paths.same(f"/api/v1/queues/{q}/messages{suffix}", json=payload)
    refused(response, 422, "validation-failed")


def test_text_that_is_no_utf8(paths: Paths, client: TestClient) -> None:
    """Lone surrogates (JSON escapes): the schema refuses them in some fields (422),
    and where it takes them the parser refuses them (400): never stored."""
    q = _queue(client, "lone-surrogates")
    json_type = {"Content-Type": "application/json"}
    consumer = paths.same(
        f"/api/v1/queues/{q}/messages/receive",
        content=b'{"consumer": "\\ud800"}',
        headers=json_type,
    )
    errors = refused(consumer, 422, "validation-failed")["errors"]
    assert [e["loc"] for e in errors] == [["body", "consumer"]]
    header = b'{"messages": [{"body": "x", "headers": {"k": "\\ud800"}}]}'
    published = paths.same(f"/api/v1/queues/{q}/messages", content=header, headers=json_type)
    assert refused(published, 400, "invalid-request")["detail"] == (
        "messages[0].headers is not valid UTF-8 text"
    )


# --- the engine's answers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "payload"),
    [
        ("", {"messages": [{"body": "x"}]}),
        ("/receive", {"max_messages": 3}),
        ("/receive", {"max_messages": 3, "ack": ["0" * RECEIPT_CHARS]}),
        ("/ack", {"receipts": ["0" * RECEIPT_CHARS]}),
        ("/nack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": False}),
        ("/extend", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 1000}),
    ],
)
def test_unknown_queue_is_404(paths: Paths, client: TestClient, suffix: str, payload: Any) -> None:
    response = paths.same(f"/api/v1/queues/no-such-queue/messages{suffix}", json=payload)
    refused(response, 404, "queue-not-found")


def test_back_pressure_is_429(paths: Paths, client: TestClient) -> None:
    q = _queue(client, "full", max_length=1)
    path = f"/api/v1/queues/{q}/messages"
    assert client.post(path, json={"messages": [{"body": "1"}]}).status_code == 201
    full = paths.same(path, json={"messages": [{"body": "2"}]})
    assert full.status_code == 429 and full.headers["retry-after"] == "1"


def test_message_over_the_queues_limit_is_413(paths: Paths, client: TestClient) -> None:
    q = _queue(client, "small", max_message_bytes=16)
    payload = {"messages": [{"body": "x"}, {"body": "y" * 17}]}
    refused(paths.same(f"/api/v1/queues/{q}/messages", json=payload), 413, "message-too-large")


def test_publish_receive_settle(client: TestClient) -> None:
    q = _queue(client, "flow")
    base = f"/api/v1/queues/{q}/messages"
    batch = {
        "messages": [
            {"body": "a", "headers": {"k": "v"}, "priority": 0, "dedup_id": None},
            {"body": "/w==", "encoding": "base64", "ttl_ms": 60000, "delay_ms": 0},
            {"body": "c"},
        ]
    }
    published = client.post(base, json=batch)
    assert published.status_code == 201 and len(_body(published)["ids"]) == 3
    for name, value in SECURITY_HEADERS.items():
        assert published.headers[name] == value
    assert published.headers["quorra-leader"] == "n1"

    got = _body(client.post(f"{base}/receive", json={"max_messages": 3}))["messages"]
    assert [m["body"] for m in got] == ["a", "/w==", "c"]
    assert [m["encoding"] for m in got] == ["utf-8", "base64", "utf-8"]
    assert got[0]["headers"] == {"k": "v"} and got[0]["delivery_count"] == 1

    acked = client.post(f"{base}/ack", json={"receipts": [got[0]["receipt"]]})
    assert acked.content == b'{"settled":1,"stale":[]}'
    stale = client.post(f"{base}/ack", json={"receipts": [got[0]["receipt"]]})
    assert refused(stale, 409, "stale-receipt")["stale"] == [got[0]["receipt"]]
    receipts = [got[1]["receipt"], got[2]["receipt"]]
    extended = client.post(f"{base}/extend", json={"receipts": receipts, "lease_ms": 5000})
    assert _body(extended) == {"settled": 2, "stale": []}
    nacked = client.post(f"{base}/nack", json={"receipts": receipts})
    assert nacked.content == b'{"settled":2,"stale":[]}'
    assert client.get(f"/api/v1/queues/{q}").json()["stats"]["messages_ready"] == 2


def test_a_receive_carrying_acks(client: TestClient) -> None:
    q = _queue(client, "piggyback")
    base = f"/api/v1/queues/{q}/messages"
    assert (
        client.post(base, json={"messages": [{"body": str(k)} for k in range(4)]}).status_code
        == 201
    )
    forged = "0" * RECEIPT_CHARS
    first = _body(client.post(f"{base}/receive", json={"max_messages": 2}))["messages"]
    answer = client.post(
        f"{base}/receive", json={"max_messages": 2, "ack": [first[0]["receipt"], forged]}
    )
    body = _body(answer)
    assert (body["settled"], body["stale"]) == (1, [forged])
    assert [m["body"] for m in body["messages"]] == ["2", "3"]

    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    asked = msgpack.packb({"max_messages": 5, "ack": [m["receipt"] for m in body["messages"]]})
    answer = client.post(f"{base}/receive", content=asked, headers=headers)
    assert answer.headers["content-type"] == MSGPACK
    assert _body(answer) == {"messages": [], "settled": 2, "stale": []}


def test_msgpack_both_ways(client: TestClient) -> None:
    q = _queue(client, "msgpack")
    base = f"/api/v1/queues/{q}/messages"
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    packed = msgpack.packb({"messages": [{"body": b"\xff\x00"}]})
    published = client.post(base, content=packed, headers=headers)
    assert published.status_code == 201 and published.headers["content-type"] == MSGPACK
    asked = msgpack.packb({"max_messages": 1})
    got = _body(client.post(f"{base}/receive", content=asked, headers=headers))["messages"][0]
    assert got["body"] == b"\xff\x00" and "encoding" not in got
    receipts = msgpack.packb({"receipts": [got["receipt"]]})
    acked = client.post(f"{base}/ack", content=receipts, headers=headers)
    assert acked.headers["content-type"] == MSGPACK
    assert _body(acked) == {"settled": 1, "stale": []}


def test_requests_are_counted_under_the_route_template(client: TestClient) -> None:
    q = _queue(client, "metrics")
    base = f"/api/v1/queues/{q}/messages"
    assert client.post(base, json={"messages": [{"body": "x"}]}).status_code == 201
    assert client.post(f"{base}/ack", json={"receipts": []}).status_code == 422
    metrics = client.get("/metrics").text
    assert 'route="/api/v1/queues/{name}/messages",status="201"' in metrics
    assert 'route="/api/v1/queues/{name}/messages/ack",status="422"' in metrics
    assert f"/api/v1/queues/{q}" not in metrics


def test_a_bad_name_is_refused_before_the_route(client: TestClient) -> None:
    for name in ("%2E%2E", "a%20b", "a%0A"):
        response = client.post(
            f"/api/v1/queues/{name}/messages", json={"messages": [{"body": "x"}]}
        )
        refused(response, 422, "validation-failed")


# --- random bodies, both ways ------------------------------------------------------

_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2**40),
    st.text(max_size=4),
    st.sampled_from(["utf-8", "base64", "aGk=", "0" * RECEIPT_CHARS]),
)
_MESSAGE = st.dictionaries(
    st.sampled_from(["body", "encoding", "headers", "priority", "ttl_ms", "delay_ms", "x"]),
    _VALUE | st.dictionaries(st.text(max_size=2), _VALUE, max_size=2),
    max_size=4,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(["", "/ack", "/nack", "/extend"]),
    st.one_of(
        st.fixed_dictionaries({"messages": st.lists(_MESSAGE, max_size=2)}),
        st.dictionaries(
            st.sampled_from(["receipts", "requeue", "lease_ms", "messages", "x"]),
            _VALUE | st.lists(_VALUE, max_size=2),
            max_size=3,
        ),
    ),
    st.booleans(),
)
def test_random_bodies_get_the_same_answer_both_ways(
    paths: Paths, client: TestClient, suffix: str, payload: Any, packed: bool
) -> None:
    """Publishes may be accepted (each way publishes its own: the same status, other
    ids); settles of receipts no receive made are refused or stale, alike."""
    q = _queue(client, "random-bodies")
    if packed:
        kwargs: dict[str, Any] = {
            "content": msgpack.packb(payload),
            "headers": {"Content-Type": MSGPACK},
        }
    else:
        kwargs = {"json": payload}
    fast, routed = paths.both(f"/api/v1/queues/{q}/messages{suffix}", **kwargs)
    if fast.status_code != 201:
        assert fast.content == routed.content
