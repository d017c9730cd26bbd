"""Any node serves any queue: on a cluster of three real server processes, a queue with
two replicas is created, used and watched through the third node, which holds no replica
of it and forwards every call (streams too) to the queue's leader (issue 15, "Any node serves any
request"); and a drained node made active again (``POST .../activate``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgpack
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.app.test_ui import csrf_of, log_in
from tests.cluster.checker import Checker
from tests.cluster.harness import Cluster

pytestmark = pytest.mark.integration

StartCluster = Callable[[int], Cluster]
WAIT_S = 20.0


def _node(cluster: Cluster, via: str, name: str) -> dict[str, Any]:
    nodes = cluster.client(via).get("/api/v1/cluster").json()["nodes"]
    entry: dict[str, Any] = next(n for n in nodes if n["name"] == name)
    return entry


def _wait_state(cluster: Cluster, via: str, name: str, state: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while _node(cluster, via, name)["state"] != state:
        assert time.monotonic() < deadline, f"{via} never saw {name} {state}"
        time.sleep(0.1)


def _until(what: str, answer: Callable[[], httpx.Response], status: int) -> httpx.Response:
    """``answer()`` until it has ``status`` (a 503 while a leader is elected is retried)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        response = answer()
        if response.status_code == status:
            return response
        assert response.status_code == 503, f"{what}: {response.status_code} {response.text}"
        assert time.monotonic() < deadline, f"{what}: still 503 after {WAIT_S} s"
        time.sleep(0.2)


def _frame(ws: ClientConnection) -> dict[str, Any]:
    frame = msgpack.unpackb(ws.recv(10.0), raw=False)
    assert isinstance(frame, dict)
    return frame


def _send(ws: ClientConnection, frame: dict[str, object]) -> None:
    ws.send(msgpack.packb(frame, use_bin_type=True))


def test_a_node_without_a_replica_serves_the_queue(start_cluster: StartCluster) -> None:
    cluster = start_cluster(3)
    outsider = "n3"
    via = cluster.client(outsider)
    # Draining, n3 takes no replica of a new queue: the queue is created through it on
    # the other two nodes. Made active again, it still holds none of it.
    drained = via.post(f"/api/v1/cluster/nodes/{outsider}/drain")
    assert drained.status_code == 202 and drained.json()["state"] == "draining", drained.text
    created = _until("create", lambda: via.put("/api/v1/queues/far", json={"replicas": 2}), 201)
    stats = created.json()["stats"]
    members = sorted(m["node"] for m in stats["raft"]["members"])
    assert members == ["n1", "n2"], stats
    assert stats["remote"]["from_node"] in members and stats["status"] == "ok", stats
    activated = via.post(f"/api/v1/cluster/nodes/{outsider}/activate")
    assert activated.status_code == 200 and activated.json()["state"] == "active", activated.text
    _wait_state(cluster, "n1", outsider, "active")
    again = via.put("/api/v1/queues/far", json={"replicas": 2})
    assert again.status_code == 200, again.text

    # Every operation through n3; each answer names the leader.
    path = "/api/v1/queues/far/messages"
    batch = {"messages": [{"body": "a", "dedup_id": "a"}, {"body": "b", "dedup_id": "b"}]}
    published = _until("publish", lambda: via.post(path, json=batch), 201)
    assert len(published.json()["ids"]) == 2
    leader = published.headers["quorra-leader"]
    assert leader in members, published.headers
    browsed = via.get(path, params={"limit": 10})
    assert browsed.status_code == 200, browsed.text
    assert [m["body"] for m in browsed.json()["messages"]] == ["a", "b"]
    shown = via.get("/api/v1/queues/far")
    assert shown.status_code == 200 and shown.headers["quorra-leader"] == leader
    assert shown.json()["stats"]["messages_ready"] == 2, shown.json()["stats"]
    listed = via.get("/api/v1/queues").json()
    assert [q["name"] for q in listed] == ["far"], listed
    ask = {"max_messages": 10, "wait_ms": 1000, "lease_ms": 5000}
    received = via.post(f"{path}/receive", json=ask)
    assert received.status_code == 200, received.text
    messages = received.json()["messages"]
    assert [m["body"] for m in messages] == ["a", "b"]
    acked = via.post(f"{path}/ack", json={"receipts": [m["receipt"] for m in messages]})
    assert acked.status_code == 200 and acked.json()["settled"] == 2, acked.text
    patched = via.patch("/api/v1/queues/far", json={"delivery_limit": 7})
    assert patched.status_code == 200, patched.text
    assert patched.json()["arguments"]["delivery_limit"] == 7
    assert _node(cluster, "n1", outsider)["replicas"] == []

    # The replica-local views and jobs come from the leader's replica.
    snapshot = via.post("/api/v1/queues/far/snapshots")
    assert snapshot.status_code == 202, snapshot.text
    compaction = via.post("/api/v1/queues/far/compactions", json={"phase": 1})
    assert compaction.status_code == 202 and compaction.json()["phase"] == "1", compaction.text
    segments = via.get("/api/v1/queues/far/segments")
    assert segments.status_code == 200, segments.text  # none flushed yet, most likely
    assert segments.json() == cluster.client(leader).get("/api/v1/queues/far/segments").json()
    # The leader's history holds the runs it made for n3.
    history = cluster.client(leader).get("/api/v1/queues/far/snapshots").json()
    assert snapshot.json()["index"] in [h["index"] for h in history], history
    runs = cluster.client(leader).get("/api/v1/queues/far/compactions").json()["history"]
    assert [r["phase"] for r in runs] == ["1"], runs
    # n3, without a replica, shows the leader's node's history (from its SQLite).
    asked = via.get("/api/v1/queues/far/snapshots")
    assert asked.status_code == 200 and asked.json() == history, asked.text
    assert asked.headers["quorra-history"] == "leader", asked.headers
    assert asked.headers["quorra-history-node"] == leader, asked.headers
    asked_runs = via.get("/api/v1/queues/far/compactions")
    assert asked_runs.json()["history"] == runs, asked_runs.text
    assert asked_runs.headers["quorra-history"] == "leader", asked_runs.headers
    mine = cluster.client(leader).get("/api/v1/queues/far/snapshots")
    assert mine.headers["quorra-history"] == "local", mine.headers
    assert mine.headers["quorra-history-node"] == leader, mine.headers
    assert _node(cluster, "n1", outsider)["replicas"] == []

    # A stream on n3: a publish confirmed, delivered, acked.
    ws_url = cluster.url(outsider).replace("http://", "ws://") + "/api/v1/queues/far/stream"
    headers = {"Authorization": f"Bearer {cluster.token(outsider)}"}
    with connect(ws_url, additional_headers=headers, open_timeout=10) as ws:
        assert _frame(ws)["op"] == "ready"
        _send(ws, {"op": "publish", "seq": 1, "messages": [{"body": b"s"}]})
        assert _frame(ws) == {"op": "confirm", "seq": 1}
        _send(ws, {"op": "consume", "prefetch": 1, "lease_ms": 5000})
        delivered = _frame(ws)
        assert delivered["op"] == "deliver", delivered
        assert [m["body"] for m in delivered["messages"]] == [b"s"]
        _send(ws, {"op": "ack", "receipts": [delivered["messages"][0]["receipt"]], "ref": 1})
        settled = _frame(ws)
        assert settled["op"] == "settled" and settled["settled"] == 1, settled

    # Under steady load through n3 alone, every confirmed message is consumed.
    checker = Checker("far", [cluster.endpoint(outsider)]).start()
    try:
        checker.wait_confirmed(30)
    finally:
        checker.stop()
    checker.check()

    # n3's dashboard shows the queue with its leader's figures.
    with httpx.Client(base_url=cluster.url(outsider), timeout=10.0) as browser:
        assert log_in(browser).status_code == 303
        for page_path in ("/fragments/overview", "/queues/far/live"):
            assert browser.get(page_path).status_code == 200, page_path
        storage = browser.get("/queues/far/storage")
        assert storage.status_code == 200, storage.text
        assert f"The runs of {leader}'s replica" in storage.text, storage.text
        assert f"The segments of {leader}'s replica" in storage.text, storage.text
        assert f'<td class="num">{snapshot.json()["index"]}</td>' in storage.text, storage.text
        for page_path in ("/fragments/queues", "/queues/far"):
            page = browser.get(page_path)
            assert page.status_code == 200 and "far" in page.text, (page_path, page.text)

    # The dashboard offers Activate for a draining node, and not for an active one.
    with httpx.Client(base_url=cluster.url("n1"), timeout=10.0) as browser:
        assert log_in(browser).status_code == 303
        assert ">Activate</button>" not in browser.get("/cluster").text
        assert via.post(f"/api/v1/cluster/nodes/{outsider}/drain").status_code == 202
        _wait_state(cluster, "n1", outsider, "draining")  # once n1 applied it too
        page = browser.get("/cluster")
        assert ">Activate</button>" in page.text
        answer = browser.post(
            f"/cluster/nodes/{outsider}/activate", headers={"X-CSRF-Token": csrf_of(page)}
        )
        assert answer.status_code == 200 and "active again" in answer.text, answer.text
    _wait_state(cluster, "n1", outsider, "active")
