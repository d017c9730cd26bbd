"""The stream endpoint (``GET /api/v1/queues/{name}/stream``) against real servers on
127.0.0.1: ``tests.app.stream_server`` (the real engine, a window of 8 messages, batches
of at most 4, a publish gate) for most tests, ``quorra serve`` for the crash test."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from app.settings import Settings
from quorra.client import (
    BODY_MAP_HEAD,
    AsyncClient,
    Client,
    Delivery,
    Message,
    Problem,
    PublishFailed,
    Settled,
    Stream,
)
from tests.app.conftest import ADMIN_PASSWORD, Server, make_token
from tests.app.stream_server import gate_path

pytestmark = pytest.mark.integration

WINDOW = 8
HEADER_READ_TIMEOUT_S = 1.0
"""The test server's: a stream outlives it (the upgrade stops that clock)."""
RECEIPT_LIKE = "0" * 64


class StreamServer(Server):
    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.app.stream_server", str(self.data_dir), str(self.port)]

    def ws_url(self, queue: str) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/queues/{queue}/stream"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamServer]:
    env = {"QUORRA_HEADER_READ_TIMEOUT_S": str(HEADER_READ_TIMEOUT_S)}
    server = StreamServer(tmp_path_factory.mktemp("quorra-stream") / "data", env=env).start()
    try:
        yield server
    finally:
        gate_path(server.data_dir).unlink(missing_ok=True)
        server.stop()


@pytest.fixture(scope="module")
def token(srv: StreamServer) -> str:
    return make_token(srv, "admin", ADMIN_PASSWORD)


@pytest.fixture(scope="module")
def api(srv: StreamServer, token: str) -> Iterator[httpx.Client]:
    with srv.client(token) as client:
        yield client


_queues = iter(range(1_000_000))


@pytest.fixture
def queue(api: httpx.Client) -> str:
    name = f"s{next(_queues)}"
    assert api.put(f"/api/v1/queues/{name}", json={}).status_code == 201
    return name


def open_stream(srv: StreamServer, token: str, queue: str) -> ClientConnection:
    ws = connect(
        srv.ws_url(queue),
        additional_headers={"Authorization": f"Bearer {token}"},
        compression=None,
        legacy=True,
        open_timeout=10,
    )
    ready = frame_of(ws)
    assert ready["op"] == "ready" and ready["window_messages"] == WINDOW, ready
    return ws


def frame_of(ws: ClientConnection, timeout_s: float = 10.0) -> dict[str, Any]:
    frame = msgpack.unpackb(ws.recv(timeout_s), raw=False)
    assert isinstance(frame, dict)
    return frame


def send(ws: ClientConnection, frame: dict[str, object]) -> None:
    ws.send(msgpack.packb(frame, use_bin_type=True))


def publish(ws: ClientConnection, seq: int, *bodies: bytes) -> None:
    send(ws, {"op": "publish", "seq": seq, "messages": [{"body": b} for b in bodies]})


def depth(api: httpx.Client, queue: str) -> int:
    stats = api.get(f"/api/v1/queues/{queue}").json()["stats"]
    return int(stats["messages_ready"]) + int(stats["messages_unacked"])


def no_frame(ws: ClientConnection, timeout_s: float) -> bool:
    try:
        ws.recv(timeout_s)
    except TimeoutError:
        return True
    return False


# --- publishing ----------------------------------------------------------------------


def test_confirms_come_only_once_the_publish_is_durable_and_cover_every_seq(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    gate = gate_path(srv.data_dir)
    with open_stream(srv, token, queue) as ws:
        gate.touch()
        try:
            publish(ws, 5, b"held")
            # held before the engine: nothing durable, so nothing confirmed
            assert no_frame(ws, 0.5)
            assert depth(api, queue) == 0
        finally:
            gate.unlink()
        assert frame_of(ws) == {"op": "confirm", "seq": 5}
        assert depth(api, queue) == 1
        # frames queued behind a publish in flight go to the engine together; the confirms
        # are cumulative and reach the last seq
        for seq in range(6, 26):
            publish(ws, seq, f"m{seq}".encode())
        last = 0
        while last < 25:
            frame = frame_of(ws)
            assert frame["op"] == "confirm" and frame["seq"] > last, frame
            last = frame["seq"]
    assert depth(api, queue) == 21
    bodies = [m["body"] for m in api.get(f"/api/v1/queues/{queue}/messages").json()["messages"]]
    assert bodies == ["held"] + [f"m{seq}" for seq in range(6, 26)]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_full_window_stops_the_server_reading_and_loses_nothing(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """With publishes held, a client that keeps sending fills the window; the server then
    reads no more (its memory does not grow with what the client sends, the client's
    sends block); once publishes go through, every frame is confirmed in order."""
    assert srv.proc is not None
    frames, body = 1_600, b"x" * 4096  # 4 messages a frame: 25 MiB, more than loopback's
    # socket buffers hold
    gate = gate_path(srv.data_dir)
    gate.touch()
    try:
        with open_stream(srv, token, queue) as ws:
            rss_before = _rss_kib(srv.proc.pid)
            sent = 0

            def sender() -> None:
                nonlocal sent
                for seq in range(1, frames + 1):
                    publish(ws, seq, body, body, body, body)
                    sent = seq

            thread = threading.Thread(target=sender, daemon=True)
            thread.start()
            time.sleep(2.0)
            assert thread.is_alive(), "every send went through: the server kept reading"
            assert sent < frames
            grown_kib = _rss_kib(srv.proc.pid) - rss_before
            assert grown_kib < 8 * 1024, f"the server grew {grown_kib} KiB"
            assert depth(api, queue) == 0
            gate.unlink()
            last = 0
            while last < frames:
                frame = frame_of(ws, 60.0)
                assert frame["op"] == "confirm" and frame["seq"] > last, frame
                last = frame["seq"]
            thread.join(10)
    finally:
        gate.unlink(missing_ok=True)
    assert depth(api, queue) == 4 * frames


def test_bad_frames_get_error_frames_and_change_nothing(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    with open_stream(srv, token, queue) as ws:
        publish(ws, 1, b"good")
        assert frame_of(ws) == {"op": "confirm", "seq": 1}

        def refused(data: bytes | str, status: int, problem: str, **about: object) -> None:
            ws.send(data)
            frame = frame_of(ws)
            assert frame["op"] == "error", frame
            assert (frame["status"], frame["type"]) == (status, f"/problems/{problem}"), frame
            assert frame["title"] and frame["detail"]
            for key, value in about.items():
                assert frame.get(key) == value, frame

        def pack(frame: object) -> bytes:
            return bytes(msgpack.packb(frame, use_bin_type=True))

        refused("text frame", 400, "invalid-request")
        refused(b"\xc1 not msgpack", 400, "invalid-request")
        refused(pack([1, 2]), 400, "invalid-request")
        refused(pack({"seq": 2}), 400, "invalid-request")
        refused(pack({"op": "launch"}), 400, "invalid-request")
        refused(pack({"op": "publish", "seq": 1, "messages": [{"body": b"x"}]}), 422,
                "validation-failed")  # fmt: skip  # not above the last seq
        refused(pack({"op": "publish", "seq": "2", "messages": []}), 422, "validation-failed")
        refused(pack({"op": "publish", "seq": 2, "messages": [{"body": 5}]}), 422,
                "validation-failed", of="publish", seq=2)  # fmt: skip
        refused(pack({"op": "publish", "seq": 3, "messages": []}), 422, "validation-failed",
                seq=3)  # fmt: skip
        refused(pack({"op": "publish", "seq": 4, "messages": [{"body": b"x"}] * 5}), 413,
                "message-too-large", seq=4)  # fmt: skip  # over batch_messages_max (4)
        refused(pack({"op": "publish", "seq": 5, "messages": [{"body": b"x", "priority": 99}]}),
                422, "validation-failed", seq=5)  # fmt: skip
        refused(pack({"op": "publish", "seq": 6, "messages": [{"body": b"x"}], "x": 1}), 422,
                "validation-failed", seq=6)  # fmt: skip
        refused(pack({"op": "consume", "prefetch": 10**6}), 422, "validation-failed",
                of="consume")  # fmt: skip
        refused(pack({"op": "consume", "prefetch": 1, "lease_ms": 0}), 422, "validation-failed")
        refused(pack({"op": "consume", "prefetch": 1, "columns": "yes"}), 422, "validation-failed",
                of="consume")  # fmt: skip
        refused(pack({"op": "ack", "receipts": ["nope"], "ref": 9}), 422, "validation-failed",
                of="ack", ref=9)  # fmt: skip
        refused(pack({"op": "extend", "receipts": [RECEIPT_LIKE]}), 422, "validation-failed")
        # the connection goes on: a good publish after all that is confirmed
        publish(ws, 7, b"after")
        assert frame_of(ws) == {"op": "confirm", "seq": 7}
    bodies = [m["body"] for m in api.get(f"/api/v1/queues/{queue}/messages").json()["messages"]]
    assert bodies == ["good", "after"]


def test_frames_sent_back_to_back_are_answered_and_published_in_order(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """Publishes taken as they are read, bad frames among them that the reader refuses:
    each bad one gets its error, every good one is confirmed, and the queue holds the
    good ones in the order they were sent."""
    bad = {seq for seq in range(1, 41) if seq % 7 == 0}
    with open_stream(srv, token, queue) as ws:
        for seq in range(1, 41):
            if seq in bad:
                send(ws, {"op": "publish", "seq": seq, "messages": []})
            else:
                publish(ws, seq, b"m%d" % seq)
        refused: set[int] = set()
        confirmed = 0
        while confirmed < 40 or len(refused) < len(bad):
            frame = frame_of(ws)
            if frame["op"] == "error":
                assert frame["status"] == 422 and frame["seq"] in bad, frame
                refused.add(frame["seq"])
            else:
                assert frame["op"] == "confirm" and frame["seq"] > confirmed, frame
                confirmed = frame["seq"]
        assert refused == bad
    listed = api.get(f"/api/v1/queues/{queue}/messages", params={"limit": 100}).json()
    bodies = [m["body"] for m in listed["messages"]]
    assert bodies == [f"m{seq}" for seq in range(1, 41) if seq not in bad]


def test_a_merged_batch_refused_whole_is_published_frame_by_frame(
    srv: StreamServer, token: str, api: httpx.Client
) -> None:
    """One frame's message over the queue's max_message_bytes fails that frame alone."""
    name = f"s{next(_queues)}"
    assert api.put(f"/api/v1/queues/{name}", json={"max_message_bytes": 100}).status_code == 201
    gate = gate_path(srv.data_dir)
    with open_stream(srv, token, name) as ws:
        gate.touch()
        try:
            publish(ws, 1, b"a")  # taken by the publisher, held at the gate
            time.sleep(0.2)
            publish(ws, 2, b"b")  # these three queue up and go to the engine together
            publish(ws, 3, b"x" * 101)
            publish(ws, 4, b"d")
            time.sleep(0.2)
        finally:
            gate.unlink()
        answers = [frame_of(ws) for _ in range(4)]
    assert answers[0] == {"op": "confirm", "seq": 1}
    assert answers[1] == {"op": "confirm", "seq": 2}
    assert answers[2]["op"] == "error" and answers[2]["seq"] == 3 and answers[2]["status"] == 413
    assert answers[3] == {"op": "confirm", "seq": 4}
    bodies = [m["body"] for m in api.get(f"/api/v1/queues/{name}/messages").json()["messages"]]
    assert bodies == ["a", "b", "d"]


# --- consuming -----------------------------------------------------------------------


def _deliveries(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < count:
        frame = frame_of(ws)
        assert frame["op"] == "deliver", frame
        out += frame["messages"]
    return out


def test_prefetch_credit_bounds_unsettled_deliveries(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    api.post(
        f"/api/v1/queues/{queue}/messages", json={"messages": [{"body": str(i)} for i in range(4)]}
    )
    api.post(
        f"/api/v1/queues/{queue}/messages",
        json={"messages": [{"body": str(i)} for i in range(4, 8)]},
    )
    with open_stream(srv, token, queue) as ws:
        send(ws, {"op": "consume", "prefetch": 3})
        first = _deliveries(ws, 3)
        assert [m["body"] for m in first] == [b"0", b"1", b"2"]
        assert all(m["delivery_count"] == 1 and len(m["receipt"]) == 64 for m in first)
        assert no_frame(ws, 0.7)  # credit spent: nothing more, though 5 are ready
        send(ws, {"op": "ack", "receipts": [first[0]["receipt"], first[1]["receipt"]], "ref": 1})
        frames = [frame_of(ws), frame_of(ws)]
        settled = next(f for f in frames if f["op"] == "settled")
        assert settled == {"op": "settled", "of": "ack", "settled": 2, "stale": [], "ref": 1}
        more = next(f for f in frames if f["op"] == "deliver")["messages"]
        more += _deliveries(ws, 2 - len(more))
        assert [m["body"] for m in more] == [b"3", b"4"]
        assert no_frame(ws, 0.5)
        # a published message is pushed as soon as there is credit for it
        send(ws, {"op": "nack", "receipts": [m["receipt"] for m in more], "requeue": True})
        assert frame_of(ws)["op"] in ("settled", "deliver")
    assert depth(api, queue) == 6


def test_a_closed_socket_returns_its_leases_at_once(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    api.post(f"/api/v1/queues/{queue}/messages", json={"messages": [{"body": "a"}, {"body": "b"}]})
    with open_stream(srv, token, queue) as ws:
        send(ws, {"op": "consume", "prefetch": 10, "lease_ms": 600_000})
        got = _deliveries(ws, 2)
        assert [m["delivery_count"] for m in got] == [1, 1]
    started = time.monotonic()
    again = api.post(
        f"/api/v1/queues/{queue}/messages/receive", json={"max_messages": 10, "wait_ms": 5000}
    ).json()["messages"]
    assert time.monotonic() - started < 5.0  # not at the end of a 10 minute lease
    assert [(m["body"], m["delivery_count"]) for m in again] == [("a", 2), ("b", 2)]
    # the old receipts are stale now
    old = api.post(
        f"/api/v1/queues/{queue}/messages/ack", json={"receipts": [m["receipt"] for m in got]}
    )
    assert old.status_code == 409


def _answers(ws: ClientConnection, settled: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """The next ``settled`` answers (in order) and the messages delivered meanwhile."""
    answers: list[dict[str, Any]] = []
    delivered: list[Any] = []
    while len(answers) < settled:
        frame = frame_of(ws)
        if frame["op"] == "deliver":
            delivered += frame["messages"]
        else:
            answers.append(frame)
    return answers, delivered


def test_acks_carried_by_the_next_receive_are_answered_each_as_alone(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """Acks that come while the consumer waits for their credit ride on its next receive
    (one entry settles them and leases more); each frame still gets its own answer: its
    forged and repeated receipts stale, the rest settled, its ``ref`` echoed."""
    api.post(
        f"/api/v1/queues/{queue}/messages",
        json={"messages": [{"body": str(i)} for i in range(4)]},
    )
    with open_stream(srv, token, queue) as ws:
        send(ws, {"op": "consume", "prefetch": 3})
        a, b, c = (m["receipt"] for m in _deliveries(ws, 3))
        forged = a[:-1] + ("0" if a[-1] != "0" else "1")
        send(ws, {"op": "ack", "receipts": [a, forged], "ref": "one"})
        send(ws, {"op": "ack", "receipts": [b, a], "ref": "two"})
        answers, delivered = _answers(ws, 2)
        assert answers == [
            {"op": "settled", "of": "ack", "settled": 1, "stale": [forged], "ref": "one"},
            {"op": "settled", "of": "ack", "settled": 1, "stale": [a], "ref": "two"},
        ]
        delivered += _deliveries(ws, 1 - len(delivered))
        assert [m["body"] for m in delivered] == [b"3"]
        last = delivered[0]["receipt"]
        # an ack whose credit the client takes back at once (prefetch 0) is settled alone
        send(ws, {"op": "consume", "prefetch": 2})  # c and 3 out: the consumer waits
        assert no_frame(ws, 0.6)  # for credit once its long poll (0.3 s) ended
        send(ws, {"op": "ack", "receipts": [c], "ref": 3})
        send(ws, {"op": "consume", "prefetch": 0})
        answers, delivered = _answers(ws, 1)
        assert answers == [{"op": "settled", "of": "ack", "settled": 1, "stale": [], "ref": 3}]
        assert delivered == [] and no_frame(ws, 0.5)
        send(ws, {"op": "ack", "receipts": [last]})
        assert frame_of(ws) == {"op": "settled", "of": "ack", "settled": 1, "stale": []}
    stats = api.get(f"/api/v1/queues/{queue}").json()["stats"]
    assert (stats["messages_ready"], stats["messages_unacked"]) == (0, 0)


def test_a_receipt_delivered_here_whose_lease_ended_is_stale_when_acked_here(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """A receipt the connection delivered (handed back without its MAC checked again) is
    still settled only while its lease lasts: once it ended and the message went to
    another consumer, the stream's ack reports it stale and settles nothing."""
    api.post(f"/api/v1/queues/{queue}/messages", json={"messages": [{"body": "x"}]})
    with open_stream(srv, token, queue) as ws:
        send(ws, {"op": "consume", "prefetch": 1, "lease_ms": 300})
        (old,) = (m["receipt"] for m in _deliveries(ws, 1))
        again = api.post(
            f"/api/v1/queues/{queue}/messages/receive", json={"max_messages": 1, "wait_ms": 5000}
        ).json()["messages"]
        assert [(m["body"], m["delivery_count"]) for m in again] == [("x", 2)]
        send(ws, {"op": "ack", "receipts": [old], "ref": 1})
        answers, _delivered = _answers(ws, 1)
        assert answers == [{"op": "settled", "of": "ack", "settled": 0, "stale": [old], "ref": 1}]
    stats = api.get(f"/api/v1/queues/{queue}").json()["stats"]
    assert (stats["messages_ready"], stats["messages_unacked"]) == (0, 1)


# --- who may ---------------------------------------------------------------------------


def _user(api: httpx.Client, srv: StreamServer, name: str, write: str, read: str) -> str:
    made = api.post(
        "/api/v1/users",
        json={
            "name": name,
            "password": "password-" + name,
            "permissions": {"write": write, "read": read},
        },
    )
    assert made.status_code == 201, made.text
    return make_token(srv, name, "password-" + name)


def test_permissions(srv: StreamServer, token: str, api: httpx.Client, queue: str) -> None:
    def denied(headers: dict[str, str], target: str = queue) -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as e:
            connect(srv.ws_url(target), additional_headers=headers, open_timeout=10, legacy=True)
        return e.value.response.status_code, json.loads(bytes(e.value.response.body or b"{}"))

    assert denied({})[0] == 401
    status, problem = denied({"Authorization": "Bearer qra_wrong"})
    assert (status, problem["type"]) == (401, "/problems/unauthorized")
    nobody = _user(api, srv, "nobody", "", "")
    status, problem = denied({"Authorization": f"Bearer {nobody}"})
    assert (status, problem["type"]) == (403, "/problems/forbidden")
    assert denied({"Authorization": f"Bearer {token}"}, "missing")[0] == 404
    assert denied({"Authorization": f"Bearer {token}"}, "bad%20name")[0] == 422

    writer = _user(api, srv, "writer", queue, "")
    with open_stream(srv, writer, queue) as ws:
        publish(ws, 1, b"w")
        assert frame_of(ws) == {"op": "confirm", "seq": 1}
        send(ws, {"op": "consume", "prefetch": 5})
        refused = frame_of(ws)
        assert (refused["status"], refused["of"]) == (403, "consume")
        send(ws, {"op": "ack", "receipts": [RECEIPT_LIKE]})
        assert frame_of(ws)["status"] == 403

    reader = _user(api, srv, "reader", "", queue)
    with open_stream(srv, reader, queue) as ws:
        publish(ws, 1, b"r")
        refused = frame_of(ws)
        assert (refused["status"], refused["of"], refused["seq"]) == (403, "publish", 1)
        send(ws, {"op": "consume", "prefetch": 5})
        assert [m["body"] for m in _deliveries(ws, 1)] == [b"w"]
    assert depth(api, queue) == 1


# --- a crash ---------------------------------------------------------------------------


def test_kill_9_mid_stream_loses_no_confirmed_message(tmp_path: Path) -> None:
    """``quorra serve`` killed while a client streams publishes: every message confirmed
    before the kill is there after the restart."""
    server = Server(tmp_path / "data").start()
    try:
        tok = make_token(server, "admin", ADMIN_PASSWORD)
        with server.client(tok) as client:
            assert client.put("/api/v1/queues/crash", json={}).status_code == 201
        ws = connect(
            f"ws://127.0.0.1:{server.port}/api/v1/queues/crash/stream",
            additional_headers={"Authorization": f"Bearer {tok}"},
            compression=None,
            legacy=True,
        )
        assert frame_of(ws)["op"] == "ready"
        confirmed, seq = 0, 0
        killed = False
        try:
            while True:
                while seq - confirmed < 200:
                    seq += 1
                    publish(ws, seq, *(f"{seq}.{i}".encode() for i in range(10)))
                frame = frame_of(ws)
                assert frame["op"] == "confirm"
                confirmed = frame["seq"]
                if confirmed >= 300 and not killed:
                    server.kill()
                    killed = True
        except (ConnectionClosed, OSError):
            pass
        finally:
            ws.close()
        assert killed
        server.start()
        with server.client(tok) as client:
            kept: set[str] = set()
            after = None
            while True:
                page = client.get(
                    "/api/v1/queues/crash/messages",
                    params={"limit": 1000, **({"after": after} if after else {})},
                ).json()
                kept.update(m["body"] for m in page["messages"])
                after = page["next_after"]
                if after is None:
                    break
        lost = [
            f"{s}.{i}" for s in range(1, confirmed + 1) for i in range(10) if f"{s}.{i}" not in kept
        ]
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {lost[:5]}"
    finally:
        server.stop()


def test_a_stream_outlives_the_header_read_timeout(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    with open_stream(srv, token, queue) as ws:
        for seq in range(1, 4):
            time.sleep(HEADER_READ_TIMEOUT_S)
            publish(ws, seq, b"late")
            assert frame_of(ws) == {"op": "confirm", "seq": seq}
    assert depth(api, queue) == 3


def test_the_openapi_description_documents_the_stream(srv: StreamServer) -> None:
    info = httpx.get(f"{srv.url}/openapi.json", timeout=10.0).json()["info"]
    for word in ("/api/v1/queues/{name}/stream", "`publish`", "`confirm`", "`deliver`", "`error`"):
        assert word in info["description"], word


# --- quorra.client ---------------------------------------------------------------------


def test_client_rest_and_stream_round_trip(srv: StreamServer, token: str, queue: str) -> None:
    with Client(srv.url, token) as client:
        ids = client.publish(queue, [b"a", "b", Message(b"c", headers={"k": "v"}, priority=1)])
        assert len(ids) == 3
        got = client.receive(queue, max_messages=10, wait_ms=1000)
        assert [d.body for d in got] == [b"a", b"b", b"c"]
        assert got[2].headers == {"k": "v"} and got[2].lease_expires_at_ms > 0
        assert client.extend(queue, [got[2].receipt], 60_000) == Settled(1, [])
        assert client.nack(queue, [got[0].receipt]) == Settled(1, [])
        assert client.ack(queue, [got[1].receipt, got[2].receipt]) == Settled(2, [])
        assert client.ack(queue, [got[2].receipt]) == Settled(0, [got[2].receipt])  # a 409
        with pytest.raises(Problem) as missing:
            client.publish("missing", [b"x"])
        assert missing.value.status == 404 and missing.value.type == "/problems/queue-not-found"

        with client.stream(queue) as stream:
            seqs = [stream.publish([f"s{i}".encode()] * 2) for i in range(10)]
            stream.wait(seqs[0])
            stream.flush()
            assert stream.ledger.confirmed_seq == seqs[-1]
            stream.publish([b"y", Message(b"z", priority=99)])
            with pytest.raises(PublishFailed) as refused:
                stream.flush()
            assert refused.value.failures[11].status == 422
            stream.consume(5)
            seen: list[bytes] = []
            while len(seen) < 21:
                batch = stream.receive(5.0)
                assert batch and len(batch) <= 5
                seen += [d.body for d in batch]
                stream.ack([d.receipt for d in batch])
            assert seen[0] == b"a" and sorted(seen[1:]) == sorted(
                f"s{i}".encode() for i in range(10) for _ in range(2)
            )
        with pytest.raises(Problem) as denied:
            Stream(srv.url, "qra_wrong", queue)
        assert denied.value.status == 401


def test_a_consumer_asking_for_columns_gets_columnar_deliver_frames(
    srv: StreamServer, token: str, queue: str
) -> None:
    sent = [Message(b"plain"), Message(b"with", headers={"k": "v", "k2": "w"})]
    sent += [Message(f"m{i}".encode()) for i in range(8)]
    with Client(srv.url, token) as client, client.stream(queue) as stream:
        for at in range(0, len(sent), 4):  # the test server's batches hold 4
            client.publish(queue, sent[at : at + 4])
        stream.consume(min(100, stream.ledger.prefetch_max), columns=True)
        got: list[Delivery] = []
        refs: list[int] = []
        deadline = time.monotonic() + 10
        while len(got) < len(sent) and time.monotonic() < deadline:
            stream.read(1.0)
            while stream.ledger.delivered_columns:
                columns = stream.ledger.delivered_columns.popleft()
                got += columns.deliveries()
                refs.append(len(refs))
                stream.ack(columns.receipt_list(), ref=refs[-1])
        assert not stream.ledger.deliveries  # nothing came as maps
        assert [(d.body, d.headers) for d in got] == [(m.body, m.headers) for m in sent]
        assert all(d.delivery_count == 1 and d.lease_expires_at_ms > 0 for d in got)
        while len(stream.ledger.answers) < len(refs) and stream.read(5.0):
            pass
        answers = [stream.ledger.answers[ref] for ref in refs]
        assert sum(a.settled for a in answers if isinstance(a, Settled)) == len(sent)


def test_async_client_and_stream(srv: StreamServer, token: str, queue: str) -> None:
    async def run() -> list[bytes]:
        async with AsyncClient(srv.url, token) as client:
            assert len(await client.publish(queue, [b"r0"])) == 1
            async with await client.stream(queue) as stream:
                for i in range(1, 20):
                    await stream.publish([f"r{i}".encode()])
                await stream.flush()
                await stream.consume(7)
                seen: list[bytes] = []
                async for d in stream.deliveries():
                    seen.append(d.body)
                    await stream.ack([d.receipt])
                    if len(seen) == 20:
                        break
            return seen

    assert asyncio.run(run()) == [f"r{i}".encode() for i in range(20)]


# --- the WebSocket protocol under the stream ------------------------------------------


def test_pings_fragments_and_the_close_handshake_around_publish_frames(
    srv: StreamServer, token: str, queue: str
) -> None:
    with open_stream(srv, token, queue) as ws:
        publish(ws, 1, b"whole")
        assert ws.ping(b"p1").wait(10)
        packed = bytes(msgpack.packb({"op": "publish", "seq": 2, "messages": [{"body": b"parts"}]}))
        ws.send([packed[:3], packed[3:9], packed[9:]])  # one message in three frames
        assert ws.ping(b"p2").wait(10)
        assert frame_of(ws) == {"op": "confirm", "seq": 1}
        assert frame_of(ws) == {"op": "confirm", "seq": 2}
        ws.close(4000, "done")
        assert (ws.close_code, ws.close_reason) == (4000, "done")  # echoed


def upgrade_request(queue: str, token: str) -> bytes:
    return (
        f"GET /api/v1/queues/{queue}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Authorization: Bearer {token}\r\n\r\n"
    ).encode()


def server_frames(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """The first ``count`` frames (opcode, payload) after the 101 response: small ones,
    unmasked, as the server sends them."""
    received = b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
        head_end = received.find(b"\r\n\r\n")
        if head_end < 0:
            continue
        assert received.startswith(b"HTTP/1.1 101"), received
        rest = received[head_end + 4 :]
        frames = []
        while len(rest) >= 2 and len(rest) >= 2 + rest[1]:
            assert rest[1] < 126, rest  # small, unmasked
            frames.append((rest[0] & 0x0F, rest[2 : 2 + rest[1]]))
            rest = rest[2 + rest[1] :]
        if len(frames) >= count:
            return frames[:count]


def test_a_frame_over_the_size_limit_closes_with_1009(
    srv: StreamServer, token: str, queue: str
) -> None:
    too_big = Settings(data_dir=Path()).request_body_bytes_max + 1  # the server's default
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.sendall(upgrade_request(queue, token))
        (ready,) = server_frames(sock, 1)
        assert msgpack.unpackb(ready[1])["op"] == "ready"
        # the head alone: refused on it, before any of the payload arrives
        sock.sendall(bytes([0x82, 0x80 | 127]) + too_big.to_bytes(8) + b"\x01\x02\x03\x04")
        close = sock.recv(65536)
        assert close[0] == 0x88 and int.from_bytes(close[2:4]) == 1009, close


def masked_frame(payload: bytes, key: bytes = b"\x01\x02\x03\x04") -> bytes:
    """A whole binary frame as a client sends it (masked), of a small payload."""
    assert len(payload) < 126
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return bytes([0x82, 0x80 | len(payload)]) + key + masked


@pytest.mark.parametrize("cut", [None, 20], ids=["one-write", "head-in-two-writes"])
def test_a_frame_sent_with_the_handshake_is_read(
    srv: StreamServer, token: str, queue: str, api: httpx.Client, cut: int | None
) -> None:
    """A client may send its first frame in the same TCP write as the handshake, before
    it has seen the 101: the server reads it from the bytes after the request's head,
    whichever chunk the head ends in."""
    frame = msgpack.packb({"op": "publish", "seq": 1, "messages": [{"body": b"a"}, {"body": b"b"}]})
    sent = upgrade_request(queue, token) + masked_frame(bytes(frame))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if cut is None:
            sock.sendall(sent)
        else:
            sock.sendall(sent[:cut])
            time.sleep(0.2)  # the server reads the head's first part alone
            sock.sendall(sent[cut:])
        ready, confirm = (msgpack.unpackb(payload) for _, payload in server_frames(sock, 2))
    assert ready["op"] == "ready"
    assert confirm == {"op": "confirm", "seq": 1}
    assert depth(api, queue) == 2


def test_a_frame_resent_with_its_dedup_id_is_confirmed_and_enqueues_nothing(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """A publish frame's ``dedup_id`` stands for all its messages: the same frame sent
    again (on another connection, as a retried batch writer does) is confirmed and adds
    nothing, next to frames it is merged with; a frame with an id whose messages carry
    their own, or a bad id, is refused and changes nothing."""
    frame_a = {
        "op": "publish",
        "dedup_id": "task-0-f0",
        "messages": [{"body": b"a1"}, {"body": b"a2"}],
    }
    with open_stream(srv, token, queue) as ws:
        send(ws, {**frame_a, "seq": 1})
        assert frame_of(ws) == {"op": "confirm", "seq": 1}
    with Stream(srv.url, token, queue) as stream:
        stream.publish([Message(b"a1"), Message(b"a2")], dedup_id="task-0-f0")
        stream.publish([Message(b"b1")], dedup_id="task-0-f2")
        stream.publish([Message(b"b1")], dedup_id="task-0-f2")
        stream.publish([Message(b"c1"), Message(b"c2")])
        stream.flush()
    bodies = [m["body"] for m in api.get(f"/api/v1/queues/{queue}/messages").json()["messages"]]
    assert bodies == ["a1", "a2", "b1", "c1", "c2"]
    with open_stream(srv, token, queue) as ws:
        mixed = {**frame_a, "seq": 1, "messages": [{"body": b"x", "dedup_id": "own"}]}
        for seq, bad in enumerate(
            (
                mixed,
                {**frame_a, "dedup_id": ""},
                {**frame_a, "dedup_id": 7},
                {**frame_a, "dedup_id": "x" * 256},
            ),
            start=1,
        ):
            send(ws, {**bad, "seq": seq})
            answer = frame_of(ws)
            assert answer["op"] == "error" and answer["seq"] == seq, answer
            assert answer["status"] == 422 and "dedup_id" in answer["detail"], answer
    assert depth(api, queue) == 5


def test_packed_frames_publish_their_bodies_and_dedup_by_frame_id(
    srv: StreamServer, token: str, api: httpx.Client, queue: str
) -> None:
    """``Stream.publish_packed``: messages packed by the caller (``BODY_MAP_HEAD``, the
    length, the body), in pieces cut anywhere between messages, are published as the
    maps they encode; the same frame id sent again enqueues nothing."""

    def packed(*bodies: bytes) -> bytes:
        return b"".join(BODY_MAP_HEAD + len(b).to_bytes(4, "big") + b for b in bodies)

    with Stream(srv.url, token, queue) as stream:
        stream.publish_packed(3, [packed(b"a1"), packed(b"", b"a3")], dedup_id="task-1-f0")
        stream.publish_packed(3, [packed(b"a1", b"", b"a3")], dedup_id="task-1-f0")
        stream.publish_packed(1, [packed(b"b1")])
        stream.flush()
    bodies = [m["body"] for m in api.get(f"/api/v1/queues/{queue}/messages").json()["messages"]]
    assert bodies == ["a1", "", "a3", "b1"]


def test_a_frame_id_is_remembered_across_a_restart(tmp_path: Path) -> None:
    """``quorra serve`` killed after a frame with a dedup id was confirmed: the same
    frame sent after the restart is confirmed and enqueues nothing."""
    server = Server(tmp_path / "data")
    server.start_timeout_s = 120.0  # a restart replays the log on a loaded machine
    server.start()
    try:
        tok = make_token(server, "admin", ADMIN_PASSWORD)
        with server.client(tok) as client:
            assert client.put("/api/v1/queues/again", json={}).status_code == 201
        frame = [Message(b"r%d" % k) for k in range(50)]
        with Stream(server.url, tok, "again") as stream:
            stream.publish(frame, dedup_id="job-7-f0")
            stream.flush()
        server.kill()
        server.start()
        with Stream(server.url, tok, "again") as stream:
            stream.publish(frame, dedup_id="job-7-f0")
            stream.publish(frame[:1], dedup_id="job-7-f50")
            stream.flush()
        with server.client(tok) as client:
            stats = client.get("/api/v1/queues/again").json()["stats"]
        assert stats["messages_ready"] == 51, stats
    finally:
        server.stop()
