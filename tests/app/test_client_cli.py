"""The publish/consume client against a scripted transport (the queue endpoints come later)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import httpx
import pytest

from app.client_cli import ClientError, consume_lines, publish_lines

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> httpx.Client:
    return httpx.Client(base_url="http://quorra.test", transport=httpx.MockTransport(handler))


def test_publish_batches_lines_with_run_unique_dedup_ids() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/queues/orders/messages"
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(201, json={"ids": list(range(len(body["messages"])))})

    progress: list[int] = []
    count = publish_lines(
        client(handler), "orders", io.StringIO("a\nb\r\nc\nd\ne\n"), 2, progress.append
    )
    assert count == 5 and progress == [2, 2, 1]
    bodies = [[m["body"] for m in b["messages"]] for b in seen]  # type: ignore[index]
    assert bodies == [["a", "b"], ["c", "d"], ["e"]]
    dedup = [m["dedup_id"] for b in seen for m in b["messages"]]  # type: ignore[attr-defined]
    assert len(set(dedup)) == 5 and len({d.rsplit("-", 1)[0] for d in dedup}) == 1


def test_publish_retries_the_same_batch_after_retry_after() -> None:
    answers = iter(
        [httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(201, json={"ids": [7]})]
    )
    bodies: list[bytes] = []
    waits: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        return next(answers)

    assert publish_lines(client(handler), "q", ["x\n"], 100, sleep=waits.append) == 1
    assert waits == [2.0] and bodies[0] == bodies[1]


def test_publish_stops_on_a_problem() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        problem = {
            "type": "/problems/forbidden",
            "title": "Not permitted",
            "status": 403,
            "detail": "no write",
        }
        return httpx.Response(403, json=problem)

    with pytest.raises(ClientError, match=r"Not permitted \(HTTP 403\): no write"):
        publish_lines(client(handler), "q", ["x"], 10)


def test_consume_writes_lines_then_acks_and_stops_when_empty() -> None:
    batches = iter(
        [
            [
                {"id": 1, "receipt": "r1", "body": "hello"},
                {"id": 2, "receipt": "r2", "body": "AP8=", "encoding": "base64"},
            ],
            [],
        ]
    )
    acked: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/receive"):
            assert body == {"max_messages": 100, "wait_ms": 500}
            return httpx.Response(200, json={"messages": next(batches)})
        assert request.url.path == "/api/v1/queues/q/messages/ack"
        acked.append(body["receipts"])
        return httpx.Response(200, json={"settled": len(body["receipts"]), "stale": []})

    out = io.BytesIO()
    assert consume_lines(client(handler), "q", out, 0, 100, 500, follow=False) == 2
    assert out.getvalue() == b"hello\n\x00\xff\n"
    assert acked == [["r1", "r2"]]


def test_consume_stops_at_max() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/receive"):
            n = body["max_messages"]
            return httpx.Response(
                200, json={"messages": [{"receipt": f"r{i}", "body": "m"} for i in range(n)]}
            )
        return httpx.Response(200, json={"settled": len(body["receipts"])})

    out = io.BytesIO()
    assert consume_lines(client(handler), "q", out, 5, 3, 0, follow=True) == 5
    assert out.getvalue().count(b"\n") == 5
