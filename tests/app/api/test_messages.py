"""The message cycle through HTTP against a real server: publish, receive, ack, nack,
extend, browse; lease expiry, delivery limit and dead-lettering, priorities, TTL, delay,
dedup; JSON and MessagePack; bad inputs are a clear 4xx and store nothing."""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import msgpack
import pytest

from tests.app.api.conftest import MSGPACK, assert_problem, new_queue, stats

pytestmark = pytest.mark.integration


def publish(client: httpx.Client, queue: str, *messages: dict[str, Any]) -> list[int]:
    response = client.post(f"/api/v1/queues/{queue}/messages", json={"messages": list(messages)})
    assert response.status_code == 201, response.text
    ids: list[int] = response.json()["ids"]
    assert len(ids) == len(messages)
    return ids


def receive(client: httpx.Client, queue: str, n: int = 10, **extra: Any) -> list[dict[str, Any]]:
    body = {"max_messages": n, **extra}
    response = client.post(f"/api/v1/queues/{queue}/messages/receive", json=body)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def settle(
    client: httpx.Client, queue: str, verb: str, receipts: list[str], **extra: Any
) -> httpx.Response:
    return client.post(
        f"/api/v1/queues/{queue}/messages/{verb}", json={"receipts": receipts, **extra}
    )


def bodies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in messages]


def test_publish_receive_ack_json(admin: httpx.Client) -> None:
    q = new_queue(admin)
    ids = publish(
        admin,
        q,
        {"body": "hello", "headers": {"k": "v"}},
        {"body": base64.b64encode(b"\x00\xffbin").decode(), "encoding": "base64"},
    )
    assert ids == sorted(ids) and len(set(ids)) == 2
    got = receive(admin, q, 10, lease_ms=60_000)
    assert [m["id"] for m in got] == ids
    assert got[0]["body"] == "hello" and got[0]["encoding"] == "utf-8"
    assert got[0]["headers"] == {"k": "v"} and got[0]["priority"] == 0
    assert got[0]["delivery_count"] == 1
    assert (
        got[0]["published_at"].endswith("Z") and got[0]["lease_expires_at"] > got[0]["published_at"]
    )
    assert got[1]["encoding"] == "base64" and base64.b64decode(got[1]["body"]) == b"\x00\xffbin"
    assert stats(admin, q)["messages_unacked"] == 2
    acked = settle(admin, q, "ack", [m["receipt"] for m in got])
    assert acked.json() == {"settled": 2, "stale": []}
    s = stats(admin, q)
    assert s["messages_ready"] == 0 and s["messages_unacked"] == 0
    assert receive(admin, q) == []


def test_publish_receive_msgpack_raw_bytes(admin: httpx.Client) -> None:
    q = new_queue(admin)
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    payload = bytes(range(256))
    body = msgpack.packb(
        {"messages": [{"body": payload, "headers": {"t": "bin"}}, {"body": "txt"}]}
    )
    published = admin.post(f"/api/v1/queues/{q}/messages", content=body, headers=headers)
    assert published.status_code == 201 and published.headers["content-type"] == MSGPACK
    ids = msgpack.unpackb(published.content)["ids"]
    got = admin.post(
        f"/api/v1/queues/{q}/messages/receive",
        content=msgpack.packb({"max_messages": 5}),
        headers=headers,
    )
    messages = msgpack.unpackb(got.content)["messages"]
    assert [m["id"] for m in messages] == ids
    assert messages[0]["body"] == payload and messages[0]["headers"] == {"t": "bin"}
    assert messages[1]["body"] == b"txt" and "encoding" not in messages[0]
    acked = admin.post(
        f"/api/v1/queues/{q}/messages/ack",
        content=msgpack.packb({"receipts": [m["receipt"] for m in messages]}),
        headers=headers,
    )
    assert msgpack.unpackb(acked.content) == {"settled": 2, "stale": []}


def test_fifo_and_strict_priorities(admin: httpx.Client) -> None:
    q = new_queue(admin, priorities=3)
    publish(admin, q, *({"body": f"low-{i}", "priority": 0} for i in range(3)))
    publish(admin, q, *({"body": f"high-{i}", "priority": 2} for i in range(2)))
    publish(admin, q, {"body": "mid-0", "priority": 1})
    got = receive(admin, q, 10)
    assert bodies(got) == ["high-0", "high-1", "mid-0", "low-0", "low-1", "low-2"]


def test_nack_requeue_then_delivery_limit_dead_letters(admin: httpx.Client) -> None:
    dlq = new_queue(admin, "dlq")
    q = new_queue(admin, delivery_limit=2, dead_letter_queue=dlq)
    publish(admin, q, {"body": "poison", "headers": {"app": "x"}})
    first = receive(admin, q)
    assert settle(admin, q, "nack", [first[0]["receipt"]]).json()["settled"] == 1
    second = receive(admin, q)
    assert bodies(second) == ["poison"] and second[0]["delivery_count"] == 2
    settle(admin, q, "nack", [second[0]["receipt"]], requeue=True)
    assert receive(admin, q) == []
    dead = receive(admin, dlq, wait_ms=5000)
    assert bodies(dead) == ["poison"]
    assert dead[0]["headers"]["app"] == "x"
    assert dead[0]["headers"]["x-death-reason"] == "delivery_limit"
    assert dead[0]["headers"]["x-death-queue"] == q


def test_nack_without_requeue_dead_letters_as_rejected(admin: httpx.Client) -> None:
    dlq = new_queue(admin, "dlq")
    q = new_queue(admin, dead_letter_queue=dlq)
    publish(admin, q, {"body": "bad"})
    got = receive(admin, q)
    assert settle(admin, q, "nack", [got[0]["receipt"]], requeue=False).json()["settled"] == 1
    dead = receive(admin, dlq, wait_ms=5000)
    assert bodies(dead) == ["bad"] and dead[0]["headers"]["x-death-reason"] == "rejected"
    assert stats(admin, q)["messages_ready"] == 0


def test_lease_expiry_redelivers_and_old_receipt_is_stale(admin: httpx.Client) -> None:
    q = new_queue(admin)
    publish(admin, q, {"body": "a"}, {"body": "b"})
    first = receive(admin, q, 2, lease_ms=300)
    time.sleep(0.8)
    again = receive(admin, q, 2, wait_ms=3000, lease_ms=60_000)
    assert bodies(again) == ["a", "b"] and [m["delivery_count"] for m in again] == [2, 2]
    stale = settle(admin, q, "ack", [m["receipt"] for m in first])
    body = assert_problem(stale, 409, "stale-receipt")
    assert body["stale"] == [m["receipt"] for m in first] and body["settled"] == 0
    mixed = settle(admin, q, "ack", [again[0]["receipt"], first[1]["receipt"]])
    assert mixed.status_code == 200
    assert mixed.json() == {"settled": 1, "stale": [first[1]["receipt"]]}


def test_extend_keeps_the_lease(admin: httpx.Client) -> None:
    q = new_queue(admin)
    publish(admin, q, {"body": "slow"})
    got = receive(admin, q, lease_ms=400)
    extended = settle(admin, q, "extend", [got[0]["receipt"]], lease_ms=60_000)
    assert extended.json() == {"settled": 1, "stale": []}
    time.sleep(0.8)
    assert receive(admin, q) == []
    assert settle(admin, q, "ack", [got[0]["receipt"]]).json()["settled"] == 1


def test_long_poll_returns_when_a_message_arrives(admin: httpx.Client, api_server: Any) -> None:
    import threading

    q = new_queue(admin)
    timer = threading.Timer(
        0.3,
        lambda: httpx.post(
            f"{api_server.url}/api/v1/queues/{q}/messages",
            json={"messages": [{"body": "late"}]},
            headers=dict(admin.headers),
        ),
    )
    started = time.monotonic()
    timer.start()
    got = receive(admin, q, 1, wait_ms=10_000)
    timer.join()
    assert bodies(got) == ["late"] and time.monotonic() - started < 5


def test_ttl_and_delay(admin: httpx.Client) -> None:
    q = new_queue(admin)
    publish(
        admin,
        q,
        {"body": "short", "ttl_ms": 100},
        {"body": "later", "delay_ms": 600},
        {"body": "now"},
    )
    time.sleep(0.3)
    assert bodies(receive(admin, q, 10)) == ["now"]
    time.sleep(0.6)
    assert bodies(receive(admin, q, 10, wait_ms=2000)) == ["later"]
    q2 = new_queue(admin, message_ttl_ms=100)
    publish(admin, q2, {"body": "gone"})
    time.sleep(1.3)
    assert receive(admin, q2, 10) == []


def test_dedup_id_makes_a_retry_idempotent(admin: httpx.Client) -> None:
    q = new_queue(admin)
    first = publish(admin, q, {"body": "once", "dedup_id": "order-42"})
    retry = publish(admin, q, {"body": "once", "dedup_id": "order-42"}, {"body": "new"})
    assert retry[0] == first[0] and retry[1] != first[0]
    assert stats(admin, q)["messages_ready"] == 2


def test_browse_pages_without_consuming(admin: httpx.Client) -> None:
    q = new_queue(admin)
    ids = publish(admin, q, *({"body": f"m{i}"} for i in range(5)))
    page = admin.get(f"/api/v1/queues/{q}/messages", params={"limit": 3}).json()
    assert [m["id"] for m in page["messages"]] == ids[:3] and page["next_after"] is not None
    rest = admin.get(
        f"/api/v1/queues/{q}/messages", params={"limit": 3, "after": page["next_after"]}
    )
    assert [m["id"] for m in rest.json()["messages"]] == ids[3:]
    assert rest.json()["next_after"] is None
    assert stats(admin, q)["messages_ready"] == 5


def test_purge_drops_ready_messages(admin: httpx.Client) -> None:
    q = new_queue(admin)
    publish(admin, q, *({"body": "x"} for _ in range(7)))
    assert admin.post(f"/api/v1/queues/{q}/purge").json() == {"purged": 7}
    assert stats(admin, q)["messages_ready"] == 0


def test_queue_full_is_429_and_drop_head_drops_oldest(admin: httpx.Client) -> None:
    q = new_queue(admin, max_length=2)
    publish(admin, q, {"body": "1"}, {"body": "2"})
    full = admin.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "3"}]})
    assert_problem(full, 429, "queue-full")
    assert full.headers["retry-after"] == "1"
    d = new_queue(admin, max_length=2, overflow="drop-head")
    publish(admin, d, {"body": "1"}, {"body": "2"}, {"body": "3"})
    assert bodies(receive(admin, d, 10)) == ["2", "3"]


# --- bad inputs: a clear 4xx, nothing stored -----------------------------------------


def _nothing_stored(admin: httpx.Client, q: str) -> None:
    s = stats(admin, q)
    assert s["messages_ready"] == 0 and s["published"] == 0, s


@pytest.mark.parametrize(
    ("payload", "status", "problem"),
    [
        ({"messages": []}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "priority": -1}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "ttl_ms": -5}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "delay_ms": 10**30}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "encoding": "latin-1"}]}, 422, "validation-failed"),
        ({"messages": [{"body": 12}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "headers": {"a": 1}}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "dedup_id": ""}]}, 422, "validation-failed"),
        ({"messages": [{"body": "x", "surprise": 1}]}, 422, "validation-failed"),
        (
            {"messages": [{"body": "x"}, {"body": "%%%", "encoding": "base64"}]},
            400,
            "invalid-request",
        ),
        ({"messages": [{"body": "x" * 2000}]}, 413, "message-too-large"),
        ({"messages": [{"body": "x"}] * 1001}, 413, "message-too-large"),
    ],
)
def test_bad_publish_is_refused_whole(
    admin: httpx.Client, payload: dict[str, Any], status: int, problem: str
) -> None:
    q = new_queue(admin, max_message_bytes=1024)
    assert_problem(admin.post(f"/api/v1/queues/{q}/messages", json=payload), status, problem)
    _nothing_stored(admin, q)


@pytest.mark.parametrize(
    ("content", "content_type", "status", "problem"),
    [
        (b'{"messages": [{"body": "\\ud800"}]}', "application/json", 400, "invalid-request"),
        (b'{"messages": [{"body": "x"}', "application/json", 400, "invalid-request"),
        (b"\xc1\xff\x00", MSGPACK, 400, "invalid-request"),
        (b"\x92\x01", MSGPACK, 400, "invalid-request"),
        (
            msgpack.packb({"messages": [{"body": b"x", "priority": 2**40}]}),
            MSGPACK,
            422,
            "validation-failed",
        ),
        (msgpack.packb([1, 2]), MSGPACK, 422, "validation-failed"),
        (b"body=x", "application/x-www-form-urlencoded", 415, "unsupported-media-type"),
    ],
)
def test_malformed_bodies(
    admin: httpx.Client, content: bytes, content_type: str, status: int, problem: str
) -> None:
    q = new_queue(admin)
    response = admin.post(
        f"/api/v1/queues/{q}/messages", content=content, headers={"Content-Type": content_type}
    )
    assert_problem(response, status, problem)
    _nothing_stored(admin, q)


def test_oversize_request_body_is_413_before_parsing(admin: httpx.Client) -> None:
    q = new_queue(admin)
    huge = b'{"messages": [{"body": "' + b"x" * (24 * 1024 * 1024) + b'"}]}'
    assert_problem(
        admin.post(
            f"/api/v1/queues/{q}/messages",
            content=huge,
            headers={"Content-Type": "application/json"},
        ),
        413,
        "message-too-large",
    )

    def chunks() -> Any:
        for _ in range(30):
            yield b"x" * (1024 * 1024)

    chunked = admin.post(
        f"/api/v1/queues/{q}/messages",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert_problem(chunked, 413, "message-too-large")
    _nothing_stored(admin, q)


@pytest.mark.parametrize(
    "body",
    [
        {"max_messages": 0},
        {"max_messages": 1001},
        {"max_messages": -1},
        {"wait_ms": 20_001},
        {"wait_ms": -1},
        {"lease_ms": 0},
        {"lease_ms": 10**20},
    ],
)
def test_receive_bounds_are_422(admin: httpx.Client, body: dict[str, Any]) -> None:
    q = new_queue(admin)
    response = admin.post(f"/api/v1/queues/{q}/messages/receive", json=body)
    assert_problem(response, 422, "validation-failed")


def test_settle_errors(admin: httpx.Client) -> None:
    q = new_queue(admin)
    url = f"/api/v1/queues/{q}/messages"
    assert_problem(admin.post(f"{url}/ack", json={"receipts": []}), 422, "validation-failed")
    assert_problem(admin.post(f"{url}/ack", json={"receipts": ["zz"]}), 422, "validation-failed")
    assert_problem(
        admin.post(f"{url}/extend", json={"receipts": ["0" * 64]}), 422, "validation-failed"
    )
    assert_problem(
        admin.post("/api/v1/queues/nope-x/messages/ack", json={"receipts": ["0" * 64]}),
        404,
        "queue-not-found",
    )
    assert_problem(
        admin.post("/api/v1/queues/nope-x/messages", json={"messages": [{"body": "x"}]}),
        404,
        "queue-not-found",
    )
    assert_problem(
        admin.post("/api/v1/queues/nope-x/messages/receive", json={}), 404, "queue-not-found"
    )
    assert_problem(admin.get("/api/v1/queues/nope-x/messages"), 404, "queue-not-found")
    assert_problem(admin.get(f"{url}", params={"limit": 0}), 422, "validation-failed")
    assert_problem(admin.get(f"{url}", params={"after": -1}), 422, "validation-failed")
