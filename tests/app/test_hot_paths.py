"""The hot paths (app/hot_paths.py) and the FastAPI routes give the same answers.

In process, one app with the real engine: every request is sent twice, once with the hot
paths on and once with them off (the FastAPI routes), and the two answers are compared:
status, media type, the headers a client acts on, and the body. Each case also says
whether the hot path answers it itself (``served``) or hands it to the routes, so that a
hot path that declined everything could not pass. A property test checks that the hot
body parsers accept only what the pydantic models accept, with the same values.
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
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app import hot_paths
from app.api.hot_bodies import publish_messages, receive_args, settle_args
from app.api.messages import outgoing
from app.api.queue_schemas import ExtendIn, NackIn, PublishIn, ReceiveIn, SettleIn
from app.hot_paths import HotPathStats
from app.main import create_app
from app.settings import Settings
from engine.errors import QuorraError
from engine.limits import DEFAULT_LIMITS
from engine.queue.receipts import RECEIPT_CHARS

with warnings.catch_warnings():
    # Starlette's test client asks for httpx2, which this project does not install.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

PASSWORD = "hot-path-password"
MSGPACK = "application/msgpack"
COMPARED_HEADERS = ("content-type", "retry-after", "www-authenticate", "allow", "x-frame-options")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    data_dir: Path = tmp_path_factory.mktemp("hot") / "data"
    yield create_app(Settings(data_dir=data_dir, admin_password=PASSWORD, node_name="n1"))


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://127.0.0.1") as c:
        token = c.post("/api/v1/tokens", auth=("admin", PASSWORD)).json()["token"]
        c.headers["Authorization"] = f"Bearer {token}"
        yield c


def _queue(client: TestClient, name: str, **arguments: Any) -> str:
    response = client.put(f"/api/v1/queues/{name}", json=arguments)
    assert response.status_code in (200, 201), response.text
    return name


def _send(
    app: FastAPI, client: TestClient, hot: bool, path: str, kwargs: dict[str, Any]
) -> tuple[Any, bool]:
    stats: HotPathStats = app.state.hot_paths
    stats.enabled = hot
    before = stats.served
    try:
        response = client.post(path, **kwargs)
    finally:
        stats.enabled = True
    return response, stats.served > before


def _body(response: Any) -> Any:
    if response.headers.get("content-type") == MSGPACK:
        return msgpack.unpackb(response.content)
    return json.loads(response.content)


def both(
    app: FastAPI, client: TestClient, path: str, *, served: bool, **kwargs: Any
) -> tuple[Any, Any]:
    """The answers with and without the hot paths; the same status, headers and media
    type, and ``served`` says whether the hot path answered the first itself."""
    hot, was_served = _send(app, client, True, path, kwargs)
    routed, _ = _send(app, client, False, path, kwargs)
    assert was_served is served, hot.text
    assert hot.status_code == routed.status_code, (hot.text, routed.text)
    for name in COMPARED_HEADERS:
        assert hot.headers.get(name) == routed.headers.get(name), name
    return hot, routed


def same(app: FastAPI, client: TestClient, path: str, *, served: bool, **kwargs: Any) -> Any:
    """``both``, for requests that change nothing: the bodies are equal too."""
    hot, routed = both(app, client, path, served=served, **kwargs)
    assert hot.content == routed.content
    return hot


# --- refusals ----------------------------------------------------------------------

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
    ({"messages": [{"body": "x"}], "more": 1}, 422),
    ([1, 2], 422),
]


@pytest.mark.parametrize(("payload", "status"), BAD_PUBLISHES)
def test_invalid_publishes_get_the_routes_answer(
    app: FastAPI, client: TestClient, payload: Any, status: int
) -> None:
    q = _queue(client, "hot-bad")
    answer = same(app, client, f"/api/v1/queues/{q}/messages", served=False, json=payload)
    assert answer.status_code == status


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b'{"messages": [{"body": "x"}', "application/json", 400),
        (b'{"messages": [{"body": "\\ud800"}]}', "application/json", 400),
        (b"", "application/json", 422),
        (b"\xc1\xff\x00", MSGPACK, 400),
        (msgpack.packb({"messages": [{"body": b"x", "priority": 2**40}]}), MSGPACK, 422),
        (b"body=x", "application/x-www-form-urlencoded", 415),
        (b'{"messages": [{"body": "x"}]}', "text/plain", 415),
    ],
)
def test_malformed_bodies_get_the_routes_answer(
    app: FastAPI, client: TestClient, content: bytes, content_type: str, status: int
) -> None:
    q = _queue(client, "hot-malformed")
    headers = {"Content-Type": content_type}
    answer = same(
        app,
        client,
        f"/api/v1/queues/{q}/messages",
        served=False,
        content=content,
        headers=headers,
    )
    assert answer.status_code == status


def test_oversize_bodies_get_the_routes_413(app: FastAPI, client: TestClient) -> None:
    q = _queue(client, "hot-oversize")
    limit = app.state.settings.request_body_bytes_max
    declared = same(
        app,
        client,
        f"/api/v1/queues/{q}/messages",
        served=False,
        content=b"{}",
        headers={"Content-Type": "application/json", "Content-Length": str(limit + 1)},
    )
    assert declared.status_code == 413

    def chunks() -> Iterator[bytes]:
        yield b'{"messages": [{"body": "'
        yield b"x" * limit
        yield b'"}]}'

    hot, _ = _send(app, client, True, f"/api/v1/queues/{q}/messages", {"content": chunks()})
    routed, _ = _send(app, client, False, f"/api/v1/queues/{q}/messages", {"content": chunks()})
    assert hot.status_code == routed.status_code == 413 and hot.content == routed.content


@pytest.mark.parametrize(
    "authorization", [None, "Bearer", "Bearer qra_not-a-token", "Basic YWRtaW46eA=="]
)
def test_missing_or_invalid_tokens_get_the_routes_401(
    app: FastAPI, client: TestClient, authorization: str | None
) -> None:
    q = _queue(client, "hot-auth")
    headers = {"Authorization": authorization or ""}
    for suffix, payload in [("", {"messages": [{"body": "x"}]}), ("/receive", {})]:
        answer = same(
            app,
            client,
            f"/api/v1/queues/{q}/messages{suffix}",
            served=False,
            json=payload,
            headers=headers,
        )
        assert answer.status_code == 401


def test_forbidden_queues_get_the_routes_403(app: FastAPI, client: TestClient) -> None:
    _queue(client, "orders.eu")
    _queue(client, "secret")
    made = client.post(
        "/api/v1/users",
        json={
            "name": "hot-app",
            "password": "hot-app-password",
            "permissions": {"write": "orders\\..*"},
        },
    )
    assert made.status_code == 201, made.text
    token = client.post("/api/v1/tokens", auth=("hot-app", "hot-app-password")).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    message = {"messages": [{"body": "x"}]}
    denied = same(
        app, client, "/api/v1/queues/secret/messages", served=False, json=message, headers=headers
    )
    assert denied.status_code == 403
    read = same(
        app,
        client,
        "/api/v1/queues/orders.eu/messages/receive",
        served=False,
        json={},
        headers=headers,
    )
    assert read.status_code == 403
    allowed, _ = both(
        app, client, "/api/v1/queues/orders.eu/messages", served=True, json=message, headers=headers
    )
    assert allowed.status_code == 201


@pytest.mark.parametrize(
    ("suffix", "payload", "status"),
    [
        ("/receive", {"max_messages": 0}, 422),
        ("/receive", {"wait_ms": 10**9}, 422),
        ("/receive", {"max_messages": "5"}, 422),  # strict: text is no integer
        ("/receive", {"consumer": ""}, 422),
        ("/receive", {"surprise": 1}, 422),
        ("/receive", {"ack": ["XYZ"]}, 422),
        ("/receive", {"ack": "0" * RECEIPT_CHARS}, 422),
        ("/receive", {"ack": ["0" * RECEIPT_CHARS] * 1001}, 422),
        ("/ack", {"receipts": []}, 422),
        ("/ack", {"receipts": ["XYZ"]}, 422),
        ("/ack", {"receipts": ["0" * RECEIPT_CHARS + "\n"]}, 422),
        ("/nack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": "yes"}, 422),  # strict: no boolean
        ("/nack", {"receipts": ["0" * RECEIPT_CHARS], "requeue": []}, 422),
        ("/extend", {"receipts": ["0" * RECEIPT_CHARS]}, 422),
        ("/extend", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 0}, 422),
    ],
)
def test_invalid_receives_and_settles_get_the_routes_answer(
    app: FastAPI, client: TestClient, suffix: str, payload: Any, status: int
) -> None:
    q = _queue(client, "hot-settle-bad")
    answer = same(app, client, f"/api/v1/queues/{q}/messages{suffix}", served=False, json=payload)
    assert answer.status_code == status


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
def test_unknown_queue_is_the_same_404(
    app: FastAPI, client: TestClient, suffix: str, payload: Any
) -> None:
    answer = same(
        app, client, f"/api/v1/queues/no-such-queue/messages{suffix}", served=True, json=payload
    )
    assert answer.status_code == 404 and _body(answer)["type"] == "/problems/queue-not-found"


def test_back_pressure_is_the_same_429(app: FastAPI, client: TestClient) -> None:
    q = _queue(client, "hot-full", max_length=1)
    path = f"/api/v1/queues/{q}/messages"
    assert client.post(path, json={"messages": [{"body": "1"}]}).status_code == 201
    full = same(app, client, path, served=True, json={"messages": [{"body": "2"}]})
    assert full.status_code == 429 and full.headers["retry-after"] == "1"


def test_message_over_the_queues_limit_is_the_same_413(app: FastAPI, client: TestClient) -> None:
    q = _queue(client, "hot-small", max_message_bytes=16)
    payload = {"messages": [{"body": "x"}, {"body": "y" * 17}]}
    answer = same(app, client, f"/api/v1/queues/{q}/messages", served=True, json=payload)
    assert answer.status_code == 413


def test_publish_receive_ack_answer_alike(app: FastAPI, client: TestClient) -> None:
    q = _queue(client, "hot-flow")
    base = f"/api/v1/queues/{q}/messages"
    batch = {
        "messages": [
            {"body": "a", "headers": {"k": "v"}, "priority": 0, "dedup_id": None},
            {"body": "/w==", "encoding": "base64", "ttl_ms": 60000, "delay_ms": 0},
        ]
    }
    hot, routed = both(app, client, base, served=True, json=batch)
    assert hot.status_code == 201
    ids = _body(hot)["ids"], _body(routed)["ids"]
    assert len(ids[0]) == len(ids[1]) == 2 and ids[0][-1] < ids[1][0]

    hot, routed = both(app, client, f"{base}/receive", served=True, json={"max_messages": 2})
    got = _body(hot)["messages"], _body(routed)["messages"]
    assert [m["body"] for m in got[0]] == [m["body"] for m in got[1]] == ["a", "/w=="]
    assert [m["encoding"] for m in got[0]] == [m["encoding"] for m in got[1]] == ["utf-8", "base64"]
    volatile = {"id", "receipt", "published_at", "lease_expires_at"}
    assert [m.keys() for m in got[0]] == [m.keys() for m in got[1]]
    assert [{k: v for k, v in m.items() if k not in volatile} for m in got[0]] == [
        {k: v for k, v in m.items() if k not in volatile} for m in got[1]
    ]

    # Each path settles a message of its own, then both see the first one stale.
    acked = [
        _send(app, client, hot, f"{base}/ack", {"json": {"receipts": [m[0]["receipt"]]}})
        for hot, m in ((True, got[0]), (False, got[1]))
    ]
    assert [served for _, served in acked] == [True, False]
    assert acked[0][0].content == acked[1][0].content == b'{"settled":1,"stale":[]}'
    stale = same(app, client, f"{base}/ack", served=True, json={"receipts": [got[0][0]["receipt"]]})
    assert stale.status_code == 409 and _body(stale)["stale"] == [got[0][0]["receipt"]]
    receipts = [got[0][1]["receipt"], got[1][1]["receipt"]]
    extended = same(
        app, client, f"{base}/extend", served=True, json={"receipts": receipts, "lease_ms": 5000}
    )
    assert _body(extended) == {"settled": 2, "stale": []}
    nacked = [
        _send(app, client, hot, f"{base}/nack", {"json": {"receipts": [receipt]}})
        for hot, receipt in zip((True, False), receipts, strict=True)
    ]
    assert nacked[0][0].content == nacked[1][0].content == b'{"settled":1,"stale":[]}'


def test_a_receive_carrying_acks_answers_alike(app: FastAPI, client: TestClient) -> None:
    """Each path receives a batch carrying the previous batch's receipts (and a forged
    one); both settle theirs and report the same stale receipts, in JSON and msgpack."""
    q = _queue(client, "hot-piggyback")
    base = f"/api/v1/queues/{q}/messages"
    batch = {"messages": [{"body": str(k)} for k in range(6)]}
    assert client.post(base, json=batch).status_code == 201
    forged = "0" * RECEIPT_CHARS
    first = [_body(client.post(f"{base}/receive", json={"max_messages": 1}))["messages"]]
    first.append(_body(client.post(f"{base}/receive", json={"max_messages": 1}))["messages"])
    got = []
    for hot, previous in ((True, first[0]), (False, first[1])):
        ack = [previous[0]["receipt"], forged]
        answer, served = _send(
            app, client, hot, f"{base}/receive", {"json": {"max_messages": 2, "ack": ack}}
        )
        assert served is hot and answer.status_code == 200, answer.text
        body = _body(answer)
        assert (body["settled"], body["stale"]) == (1, [forged])
        got.append(body["messages"])
    assert [[m["body"] for m in g] for g in got] == [["2", "3"], ["4", "5"]]
    assert client.get(f"/api/v1/queues/{q}").json()["stats"]["messages_unacked"] == 4

    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    answers = []
    for hot, previous in ((True, got[0]), (False, got[1])):
        asked = msgpack.packb({"max_messages": 5, "ack": [m["receipt"] for m in previous]})
        answer, served = _send(
            app, client, hot, f"{base}/receive", {"content": asked, "headers": headers}
        )
        assert served is hot and answer.headers["content-type"] == MSGPACK
        answers.append(_body(answer))
    assert answers == [{"messages": [], "settled": 2, "stale": []}] * 2
    stale = [m["receipt"] for m in got[0]]
    again = same(app, client, f"{base}/receive", served=True, json={"ack": stale})
    assert again.status_code == 200
    assert _body(again) == {"messages": [], "settled": 0, "stale": stale}


def test_msgpack_both_ways_answers_alike(app: FastAPI, client: TestClient) -> None:
    q = _queue(client, "hot-msgpack")
    base = f"/api/v1/queues/{q}/messages"
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    packed = msgpack.packb({"messages": [{"body": b"\xff\x00"}, {"body": b"\xff\x00"}]})
    for hot in (True, False):
        response, served = _send(app, client, hot, base, {"content": packed, "headers": headers})
        assert response.status_code == 201 and served is hot
        assert response.headers["content-type"] == MSGPACK
    asked = msgpack.packb({"max_messages": 1})
    hot, routed = both(app, client, f"{base}/receive", served=True, content=asked, headers=headers)
    got = _body(hot)["messages"][0], _body(routed)["messages"][0]
    assert got[0]["body"] == got[1]["body"] == b"\xff\x00" and got[0].keys() == got[1].keys()
    assert "encoding" not in got[0]
    acked = [
        _send(app, client, hot, f"{base}/ack", {"content": receipts, "headers": headers})
        for hot, receipts in (
            (True, msgpack.packb({"receipts": [got[0]["receipt"]]})),
            (False, msgpack.packb({"receipts": [got[1]["receipt"]]})),
        )
    ]
    assert [served for _, served in acked] == [True, False]
    assert [response.headers["content-type"] for response, _ in acked] == [MSGPACK, MSGPACK]
    assert _body(acked[0][0]) == _body(acked[1][0]) == {"settled": 1, "stale": []}


def test_hot_requests_are_counted_under_the_route_template(
    app: FastAPI, client: TestClient
) -> None:
    q = _queue(client, "hot-metrics")
    assert (
        client.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]}).status_code
        == 201
    )
    metrics = client.get("/metrics").text
    assert 'route="/api/v1/queues/{name}/messages",status="201"' in metrics
    assert f"/api/v1/queues/{q}" not in metrics


# --- the parsers against the models ---------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"body": "x"}], "messages": [{"body": "y"}]}',
        b'{"messages": [{"body": "\\u00e9\\u2028\\ud83d\\ude00"}]}',
        b'\xef\xbb\xbf{"messages": [{"body": "x"}]}',
        b'{"messages": [{"body": "x", "priority": 18446744073709551616}]}',
        b'{"messages": [{"body": "x", "ttl_ms": 1e400}]}',
        b'{"messages": [{"body": "x", "delay_ms": NaN}]}',
        b'{"messages": [{"body": "\\ud800"}]}',
        b'{"messages": [{"body": "\xff"}]}',
    ],
)
def test_the_hot_json_parser_agrees_with_the_routes_or_declines(raw: bytes) -> None:
    """What the hot path's JSON parser (orjson) accepts, and the publish parser then
    takes, is what the route reads with the standard library."""
    try:
        payload = hot_paths._decoded("application/json", raw)
    except hot_paths._Decline:
        return
    batch = publish_messages(payload, DEFAULT_LIMITS)
    if batch is not None:
        assert batch == outgoing(PublishIn.model_validate(json.loads(raw)), DEFAULT_LIMITS)


_INTS = st.one_of(
    st.integers(min_value=-3, max_value=12),
    st.sampled_from([2**31, 2**62, 10**30, 315360000000, 315360000001, 2592000000, 2592000001]),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.none(),
)
_TEXT = st.one_of(st.text(max_size=8), st.binary(max_size=8), st.integers(), st.none())
_ODD_MESSAGE = st.dictionaries(
    st.sampled_from(["body", "encoding", "headers", "priority", "ttl_ms", "dedup_id", "x"]),
    st.one_of(_INTS, _TEXT, st.dictionaries(st.text(max_size=2), _TEXT, max_size=2)),
    max_size=5,
)
_MESSAGE = st.fixed_dictionaries(
    {"body": st.one_of(st.text(max_size=8), st.binary(max_size=8))},
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


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(_MESSAGE, min_size=1, max_size=2),
        st.lists(st.one_of(_MESSAGE, _ODD_MESSAGE), max_size=3),
        _INTS,
    )
)
@example([{"body": "x"}, {"body": "aGk=", "encoding": "base64", "headers": {"a": "b"}}])
@example([{"body": b"x", "priority": 9, "ttl_ms": 0, "delay_ms": 2592000000, "dedup_id": "d"}])
def test_the_publish_parser_accepts_only_what_the_model_accepts(messages: Any) -> None:
    payload = {"messages": messages}
    parsed = publish_messages(payload, DEFAULT_LIMITS)
    if parsed is None:
        return
    try:
        expected = outgoing(PublishIn.model_validate(payload), DEFAULT_LIMITS)
    except (ValidationError, QuorraError) as e:
        raise AssertionError(f"the hot parser accepted what the route refuses: {e}") from None
    assert parsed == expected


_RECEIPT = st.one_of(
    st.from_regex(rf"[0-9a-f]{{{RECEIPT_CHARS}}}", fullmatch=True),
    st.text(
        alphabet="0123456789abcdefABCDEF\n", min_size=RECEIPT_CHARS - 1, max_size=RECEIPT_CHARS + 1
    ),
    st.integers(),
    st.binary(),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["max_messages", "wait_ms", "lease_ms", "consumer", "ack", "x"]),
        st.one_of(
            _INTS,
            _TEXT,
            st.sampled_from([1000, 1001, 20000, 20001, 43200000, 43200001]),
            st.lists(_RECEIPT, max_size=3),
        ),
        max_size=4,
    )
)
@example({"max_messages": 1000, "wait_ms": 20000, "lease_ms": 1, "consumer": "c"})
@example({"ack": []})
@example({"ack": None, "max_messages": 5})
@example({"ack": ["0" * RECEIPT_CHARS, "f" * RECEIPT_CHARS]})
def test_the_receive_parser_accepts_only_what_the_model_accepts(payload: dict[str, Any]) -> None:
    parsed = receive_args(payload)
    if parsed is None:
        return
    model = ReceiveIn.model_validate(payload)
    assert (parsed.max_messages, parsed.wait_ms, parsed.lease_ms, parsed.consumer, parsed.ack) == (
        model.max_messages,
        model.wait_ms,
        model.lease_ms,
        model.consumer,
        model.ack,
    )


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["ack", "nack", "extend"]),
    st.fixed_dictionaries(
        {"receipts": st.lists(_RECEIPT, min_size=1, max_size=3)},
        optional={"requeue": st.one_of(st.booleans(), _INTS), "lease_ms": _INTS},
    )
    | st.dictionaries(
        st.sampled_from(["receipts", "requeue", "lease_ms", "x"]),
        st.one_of(st.lists(_RECEIPT, min_size=1, max_size=3), st.booleans(), _INTS),
        max_size=3,
    ),
)
@example("extend", {"receipts": ["0" * RECEIPT_CHARS], "lease_ms": 43200000})
@example("nack", {"receipts": ["0" * RECEIPT_CHARS, "f" * RECEIPT_CHARS], "requeue": False})
def test_the_settle_parsers_accept_only_what_the_models_accept(
    how: str, payload: dict[str, Any]
) -> None:
    parsed = settle_args(how, payload)
    if parsed is None:
        return
    if how == "ack":
        assert parsed.receipts == SettleIn.model_validate(payload).receipts
    elif how == "nack":
        nack = NackIn.model_validate(payload)
        assert (parsed.receipts, parsed.requeue) == (nack.receipts, nack.requeue)
    else:
        extend = ExtendIn.model_validate(payload)
        assert (parsed.receipts, parsed.lease_ms) == (extend.receipts, extend.lease_ms)
