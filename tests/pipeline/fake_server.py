"""An in-process stand-in for the message endpoints of API.md (MessagePack only), for
unit tests of the pipeline's client-side logic: leases that expire on a clock the test
controls, stale receipts, dedup ids, browse cursors. Integration tests use the real
server (conftest ``quorra_server``).
"""

from __future__ import annotations

import secrets
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import msgpack

MSGPACK = "application/msgpack"


@dataclass
class Msg:
    id: int
    body: bytes
    headers: dict[str, str]
    priority: int
    published_at_ms: int
    delivery_count: int = 0
    position: int = 0


@dataclass
class Lease:
    msg: Msg
    expires_ms: float


@dataclass
class FakeQueue:
    ready: deque[Msg] = field(default_factory=deque)
    leases: dict[str, Lease] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)
    next_id: int = 1
    next_position: int = 0
    published: int = 0
    acked: int = 0


class FakeQuorra:
    """State plus a clock in ms that tests may move forward (``advance``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queues: dict[str, FakeQueue] = {}
        self.now_ms = 1_700_000_000_000.0
        self.fail_next_acks = 0

    def advance(self, ms: float) -> None:
        with self.lock:
            self.now_ms += ms

    def _expire(self, q: FakeQueue) -> None:
        for receipt, lease in list(q.leases.items()):
            if lease.expires_ms <= self.now_ms:
                del q.leases[receipt]
                q.ready.appendleft(lease.msg)

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        parts = path.removeprefix("/api/v1/queues/").split("/")
        name = parts[0]
        with self.lock:
            if method == "PUT" and len(parts) == 1:
                self.queues.setdefault(name, FakeQueue())
                return 201, {"name": name}
            q = self.queues.get(name)
            if q is None:
                return 404, {"type": "/problems/queue-not-found", "title": "no queue"}
            self._expire(q)
            rest = "/".join(parts[1:])
            if method == "GET" and rest == "":
                return 200, {
                    "name": name,
                    "messages_ready": len(q.ready),
                    "messages_unacked": len(q.leases),
                }
            if method == "POST" and rest == "messages":
                return 201, {"ids": [self._publish(q, m) for m in body["messages"]]}
            if method == "POST" and rest == "messages/receive":
                return 200, {"messages": self._receive(q, body)}
            if method == "POST" and rest in ("messages/ack", "messages/nack", "messages/extend"):
                return 200, self._settle(q, rest.split("/")[1], body)
            if method == "GET" and rest == "messages":
                return 200, {"messages": self._browse(q, query)}
        return 404, {"type": "/problems/not-found", "title": "no route"}

    def _publish(self, q: FakeQueue, m: dict[str, Any]) -> int:
        dedup_id = m.get("dedup_id")
        if dedup_id and dedup_id in q.dedup:
            return q.dedup[dedup_id]
        msg = Msg(
            id=q.next_id * 1024,
            body=bytes(m["body"]),
            headers=dict(m.get("headers") or {}),
            priority=int(m.get("priority") or 0),
            published_at_ms=int(self.now_ms),
            position=q.next_position,
        )
        q.next_id += 1
        q.next_position += 1
        q.published += 1
        q.ready.append(msg)
        if dedup_id:
            q.dedup[dedup_id] = msg.id
        return msg.id

    def _receive(self, q: FakeQueue, body: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        lease_ms = int(body.get("lease_ms") or 30_000)
        for _ in range(min(int(body["max_messages"]), len(q.ready))):
            msg = q.ready.popleft()
            msg.delivery_count += 1
            receipt = secrets.token_hex(16)
            q.leases[receipt] = Lease(msg, self.now_ms + lease_ms)
            out.append({**_view(msg), "receipt": receipt})
        return out

    def _settle(self, q: FakeQueue, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        stale: list[int] = []
        settled = 0
        for i, receipt in enumerate(body["receipts"]):
            lease = q.leases.get(receipt)
            if lease is None:
                stale.append(i)
                continue
            settled += 1
            if verb == "ack":
                del q.leases[receipt]
                q.acked += 1
            elif verb == "nack":
                del q.leases[receipt]
                q.ready.appendleft(lease.msg)
            else:
                lease.expires_ms = self.now_ms + int(body["lease_ms"])
        return {"settled": settled, "stale": stale}

    def _browse(self, q: FakeQueue, query: dict[str, str]) -> list[dict[str, Any]]:
        after = int(query["after"]) if "after" in query else -1
        limit = int(query.get("limit", 100))
        items = sorted((m for m in q.ready if m.position > after), key=lambda m: m.position)
        return [{**_view(m), "cursor": m.position} for m in items[:limit]]


def _view(m: Msg) -> dict[str, Any]:
    return {
        "id": m.id,
        "body": m.body,
        "headers": m.headers,
        "priority": m.priority,
        "delivery_count": m.delivery_count,
        "published_at": m.published_at_ms,
    }


def serve(state: FakeQuorra) -> tuple[ThreadingHTTPServer, str]:
    """Start the fake on 127.0.0.1 in a daemon thread; returns the server and its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _any(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = msgpack.unpackb(raw, raw=False) if raw else None
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            status, answer = state.handle(self.command, url.path, query, body)
            data = msgpack.packb(answer, use_bin_type=True)
            self.send_response(status)
            kind = MSGPACK if status < 400 else "application/problem+json"
            if status >= 400:
                import json

                data = json.dumps(answer).encode()
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
