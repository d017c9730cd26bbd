"""``quorra publish`` and ``quorra consume`` against scripted servers: a stream whose answers
the test gives (the real ledger keeps the books), a REST transport answering as scripted."""

from __future__ import annotations

import io
from collections.abc import Callable

import httpx
import msgpack
import pytest

from app.client_cli import ClientError, consume_lines, publish_lines
from quorra.client import Client, Message, Problem, Publishable, Settled
from quorra.client._ledger import Ledger

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> Client:
    return Client("http://quorra.test", "qra_test", transport=httpx.MockTransport(handler))


def answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(
        status, content=msgpack.packb(body), headers={"Content-Type": "application/msgpack"}
    )


class FakeStream:
    """A stream whose server is the test: frames go to ``sent``, answers are fed to the
    real ledger by hand."""

    def __init__(self, window: int = 3) -> None:
        ready = {"op": "ready", "window_messages": window, "batch_messages_max": 1000,
                 "prefetch_max": 100}  # fmt: skip
        self.ledger = Ledger(ready, None)
        self.sent: list[tuple[int, list[Message]]] = []
        self.answers: list[dict[str, object]] = []

    def publish(self, messages: list[Publishable]) -> int:
        while not self.ledger.room_for(len(messages)):
            assert self.read(None)
        seq, _frame = self.ledger.publish_frame(messages)
        self.sent.append((seq, [m for m in messages if isinstance(m, Message)]))
        return seq

    def read(self, _timeout_s: float | None) -> bool:
        """The server's next answer: confirm the oldest outstanding publish, unless a
        scripted answer is waiting."""
        if self.answers:
            self.ledger.on_frame(self.answers.pop(0))
            return True
        oldest = next(iter(self.ledger.outstanding))
        self.ledger.on_frame({"op": "confirm", "seq": oldest})
        return True


def problem(status: int, seq: int, **extra: object) -> dict[str, object]:
    return {"op": "error", "of": "publish", "seq": seq, "status": status,
            "type": "/problems/x", "title": "Refused", "detail": "no", **extra}  # fmt: skip


def test_publish_sends_frames_of_lines_with_run_unique_dedup_ids() -> None:
    stream = FakeStream(window=3)
    progress: list[int] = []
    lines = io.StringIO("a\nb\r\nc\nd\ne\n")
    count = publish_lines(stream, lines, 2, progress.append)  # type: ignore[arg-type]
    assert count == 5 and sum(progress) == 5
    bodies = [[m.body for m in messages] for _seq, messages in stream.sent]
    assert bodies == [[b"a", b"b"], [b"c", b"d"], [b"e"]]
    dedup = [m.dedup_id or "" for _seq, messages in stream.sent for m in messages]
    assert len(set(dedup)) == 5 and len({d.rsplit("-", 1)[0] for d in dedup}) == 1
    assert not stream.ledger.outstanding


def test_publish_sends_a_frame_again_after_retry_after() -> None:
    stream = FakeStream(window=10)
    stream.answers = [problem(429, 1, retry_after_s=2)]
    waits: list[float] = []
    assert publish_lines(stream, ["x\n"], 100, sleep=waits.append) == 1  # type: ignore[arg-type]
    assert waits == [2.0]
    assert [seq for seq, _ in stream.sent] == [1, 2]
    assert stream.sent[0][1] == stream.sent[1][1]  # the same messages, dedup ids and all


def test_publish_stops_on_a_problem() -> None:
    stream = FakeStream(window=10)
    stream.answers = [problem(403, 1)]
    with pytest.raises(ClientError, match=r"Refused \(HTTP 403\): no"):
        publish_lines(stream, ["x"], 10)  # type: ignore[arg-type]


def test_consume_writes_lines_then_acks_and_stops_when_empty() -> None:
    batches = iter(
        [
            [
                {"id": 1, "receipt": "r1", "body": b"hello", "delivery_count": 1},
                {"id": 2, "receipt": "r2", "body": b"\x00\xff", "delivery_count": 1},
            ],
            [],
        ]
    )
    acked: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = msgpack.unpackb(request.content)
        if request.url.path.endswith("/receive"):
            assert body == {"max_messages": 100, "wait_ms": 500}
            return answer(200, {"messages": next(batches)})
        assert request.url.path == "/api/v1/queues/q/messages/ack"
        acked.append(body["receipts"])
        return answer(200, {"settled": len(body["receipts"]), "stale": []})

    out = io.BytesIO()
    assert consume_lines(client(handler), "q", out, 0, 100, 500, follow=False) == 2
    assert out.getvalue() == b"hello\n\x00\xff\n"
    assert acked == [["r1", "r2"]]


def test_consume_stops_at_max() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = msgpack.unpackb(request.content)
        if request.url.path.endswith("/receive"):
            n = body["max_messages"]
            messages = [
                {"id": i, "receipt": f"r{i}", "body": b"m", "delivery_count": 1} for i in range(n)
            ]
            return answer(200, {"messages": messages})
        return answer(200, {"settled": len(body["receipts"]), "stale": []})

    out = io.BytesIO()
    assert consume_lines(client(handler), "q", out, 5, 3, 0, follow=True) == 5
    assert out.getvalue().count(b"\n") == 5


def test_settle_answers_are_kept_by_ref_until_taken() -> None:
    ledger = FakeStream().ledger
    frame = msgpack.unpackb(ledger.settle_frame("ack", ["r1", "r2"], ref=7))
    assert frame == {"op": "ack", "receipts": ["r1", "r2"], "ref": 7}
    ledger.on_frame({"op": "settled", "of": "ack", "settled": 1, "stale": ["r2"], "ref": 7})
    problem = {"op": "error", "of": "extend", "ref": 8, "status": 422, "type": "x", "title": "Bad"}
    ledger.on_frame(problem)
    ledger.on_frame({"op": "settled", "of": "ack", "settled": 2, "stale": []})  # no ref
    assert ledger.answers.pop(7) == Settled(1, ["r2"])
    assert isinstance(ledger.answers.pop(8), Problem) and not ledger.answers
    assert ledger.settled == 3 and not ledger.problems


def test_call_reaches_any_endpoint_with_its_query() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/missing"):
            return answer(404, {"type": "/problems/queue-not-found", "title": "No queue"})
        return answer(200, [{"id": 1, "cursor": 5}])

    with client(handler) as c:
        assert c.call("GET", "/queues/q/messages", after=None, limit=10) == [{"id": 1, "cursor": 5}]
        with pytest.raises(Problem, match="No queue"):
            c.call("GET", "/queues/missing")
    assert str(seen[0].url) == "http://quorra.test/api/v1/queues/q/messages?limit=10"
