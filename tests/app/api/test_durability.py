"""Nothing confirmed is lost: a graceful restart mid-stream, and a kill -9 of the server
process under publish and consume load, each followed by a restart on the same data."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.app.api.conftest import ADMIN_PASSWORD, Server, kill_hard, make_token

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _drain(client: httpx.Client, queue: str) -> list[str]:
    """Receive and ack until the queue stays empty; the bodies in delivery order."""
    out: list[str] = []
    while True:
        got = client.post(
            f"/api/v1/queues/{queue}/messages/receive",
            json={"max_messages": 1000, "wait_ms": 1500},
        )
        assert got.status_code == 200, got.text
        messages = got.json()["messages"]
        if not messages:
            return out
        out += [m["body"] for m in messages]
        acked = client.post(
            f"/api/v1/queues/{queue}/messages/ack",
            json={"receipts": [m["receipt"] for m in messages]},
        )
        assert acked.status_code == 200, acked.text


def _restart(server: Server) -> httpx.Client:
    server.start()
    return server.client(make_token(server, "admin", ADMIN_PASSWORD))


def test_restart_mid_stream_loses_nothing_confirmed(fresh_server: Server) -> None:
    client = fresh_server.client(make_token(fresh_server, "admin", ADMIN_PASSWORD))
    assert client.put("/api/v1/queues/stream", json={"lease_ms": 1000}).status_code == 201
    published: list[str] = []
    for b in range(20):
        batch = [f"m-{b}-{i}" for i in range(50)]
        response = client.post(
            "/api/v1/queues/stream/messages", json={"messages": [{"body": x} for x in batch]}
        )
        assert response.status_code == 201
        published += batch
    got = client.post("/api/v1/queues/stream/messages/receive", json={"max_messages": 300})
    messages = got.json()["messages"]
    acked = [m["body"] for m in messages[:200]]
    settle = {"receipts": [m["receipt"] for m in messages[:200]]}
    assert client.post("/api/v1/queues/stream/messages/ack", json=settle).json()["settled"] == 200
    client.close()  # 100 messages stay leased across the restart

    fresh_server.stop()
    client = _restart(fresh_server)
    with client:
        assert client.get("/api/v1/queues/stream").json()["arguments"]["lease_ms"] == 1000
        time.sleep(1.2)  # the leases of the 100 end
        remaining = _drain(client, "stream")
    assert sorted(remaining) == sorted(set(published) - set(acked))
    assert len(remaining) == len(set(remaining))


class Load:
    """Publisher and consumer threads that record only what the server confirmed."""

    def __init__(self, server: Server, token: str) -> None:
        self.url, self.token = server.url, token
        self.stop = threading.Event()
        self.confirmed: set[str] = set()
        self.acked: set[str] = set()
        """Acks the server confirmed."""
        self.ack_sent: set[str] = set()
        """Acks sent, confirmed or not (one in flight at the kill may have committed)."""
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=5.0)

    def publisher(self, worker: int) -> None:
        n = 0
        with self._client() as client:
            while not self.stop.is_set():
                batch = [f"w{worker}-{n + i}" for i in range(10)]
                n += 10
                body: dict[str, Any] = {"messages": [{"body": x, "dedup_id": x} for x in batch]}
                try:
                    response = client.post("/api/v1/queues/load/messages", json=body)
                except httpx.TransportError:
                    return
                if response.status_code == 201:
                    with self.lock:
                        self.confirmed.update(batch)

    def consumer(self) -> None:
        with self._client() as client:
            while not self.stop.is_set():
                try:
                    got = client.post(
                        "/api/v1/queues/load/messages/receive",
                        json={"max_messages": 20, "wait_ms": 200},
                    ).json()["messages"]
                    if not got:
                        continue
                    receipts = [m["receipt"] for m in got]
                    with self.lock:
                        self.ack_sent.update(m["body"] for m in got)
                    acked = client.post(
                        "/api/v1/queues/load/messages/ack", json={"receipts": receipts}
                    )
                except httpx.TransportError:
                    return
                if acked.status_code == 200:
                    stale = set(acked.json()["stale"])
                    with self.lock:
                        self.acked.update(m["body"] for m in got if m["receipt"] not in stale)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self.publisher, args=(w,)) for w in range(4)]
        self.threads.append(threading.Thread(target=self.consumer))
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)


def test_kill_9_under_load_loses_nothing_confirmed(fresh_server: Server) -> None:
    token = make_token(fresh_server, "admin", ADMIN_PASSWORD)
    with fresh_server.client(token) as client:
        assert client.put("/api/v1/queues/load", json={"lease_ms": 1000}).status_code == 201
    load = Load(fresh_server, token)
    load.start()
    time.sleep(2.0)
    kill_hard(fresh_server)  # mid-request: some publishes and acks are in flight
    load.join()
    assert len(load.confirmed) > 100, "the load did not get going"

    with _restart(fresh_server) as client:
        time.sleep(1.2)  # leases taken before the kill end
        remaining = _drain(client, "load")
    assert len(remaining) == len(set(remaining)), "a message was delivered twice after restart"
    lost = load.confirmed - load.ack_sent - set(remaining)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"
    again = load.acked & set(remaining)
    assert not again, f"{len(again)} acked messages delivered again, e.g. {sorted(again)[:5]}"
