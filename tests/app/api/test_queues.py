"""Queue administration through HTTP against a real server: create (idempotent, 409 on
other arguments), list, show, change policies, delete, purge; names; permissions;
snapshots, compactions, segments, cluster; audit log and per-queue metrics."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

import httpx
import pytest

from tests.app.api.conftest import Server, assert_problem, make_token, new_queue

pytestmark = pytest.mark.integration


def user_client(server: Server, admin: httpx.Client, **permissions: str) -> httpx.Client:
    name, password = f"u-{secrets.token_hex(4)}", secrets.token_urlsafe(12)
    body = {"name": name, "password": password, "permissions": permissions}
    assert admin.post("/api/v1/users", json=body).status_code == 201
    return server.client(make_token(server, name, password))


def test_create_is_idempotent_and_conflicts_on_other_arguments(admin: httpx.Client) -> None:
    name = f"orders-{secrets.token_hex(4)}"
    args = {"max_length": 100, "priorities": 3, "lease_ms": 5000}
    created = admin.put(f"/api/v1/queues/{name}", json=args)
    assert created.status_code == 201
    body = created.json()
    assert body["name"] == name and body["arguments"]["max_length"] == 100
    assert body["arguments"]["replicas"] == 1 and body["arguments"]["delivery_limit"] == 20
    for key in ("messages_ready", "messages_unacked", "bytes_ready", "consumers", "raft", "log"):
        assert key in body["stats"]
    assert body["stats"]["raft"]["leader"] is not None
    assert admin.put(f"/api/v1/queues/{name}", json=args).status_code == 200
    assert_problem(
        admin.put(f"/api/v1/queues/{name}", json={**args, "max_length": 5}), 409, "queue-conflict"
    )
    assert admin.put(f"/api/v1/queues/p-{secrets.token_hex(4)}").status_code == 201  # no body


def test_get_list_patch_delete(admin: httpx.Client) -> None:
    name = new_queue(admin, message_ttl_ms=60_000)
    assert admin.get(f"/api/v1/queues/{name}").json()["arguments"]["message_ttl_ms"] == 60_000
    assert name in [q["name"] for q in admin.get("/api/v1/queues").json()]
    patched = admin.patch(
        f"/api/v1/queues/{name}", json={"message_ttl_ms": None, "delivery_limit": 3}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["arguments"]["message_ttl_ms"] is None
    assert patched.json()["arguments"]["delivery_limit"] == 3
    assert_problem(admin.patch(f"/api/v1/queues/{name}", json={}), 422, "validation-failed")
    assert_problem(
        admin.patch(f"/api/v1/queues/{name}", json={"priorities": 4}), 422, "validation-failed"
    )
    assert_problem(
        admin.patch(f"/api/v1/queues/{name}", json={"lease_ms": None}), 422, "validation-failed"
    )
    assert admin.delete(f"/api/v1/queues/{name}").status_code == 204
    assert_problem(admin.get(f"/api/v1/queues/{name}"), 404, "queue-not-found")
    assert_problem(admin.delete(f"/api/v1/queues/{name}"), 404, "queue-not-found")
    assert_problem(
        admin.patch(f"/api/v1/queues/{name}", json={"max_length": 1}), 404, "queue-not-found"
    )
    assert_problem(admin.post(f"/api/v1/queues/{name}/purge"), 404, "queue-not-found")
    assert name not in [q["name"] for q in admin.get("/api/v1/queues").json()]


@pytest.mark.parametrize(
    "raw_name",
    [
        "bad%20name",
        "..%2Fetc",
        "%2E%2E",
        "..%2F..%2Fmeta.sqlite3",
        "a%00b",
        "x" * 201,
        "caf%C3%A9",
        "semi%3Bcolon",
    ],
)
def test_invalid_names_are_422(admin: httpx.Client, raw_name: str) -> None:
    for method, suffix in (("PUT", ""), ("GET", ""), ("POST", "/messages"), ("GET", "/messages")):
        response = admin.request(method, f"/api/v1/queues/{raw_name}{suffix}")
        assert_problem(response, 422, "validation-failed")
    assert raw_name not in [q["name"] for q in admin.get("/api/v1/queues").json()]


@pytest.mark.parametrize(
    "args",
    [
        {"max_length": -1},
        {"priorities": 0},
        {"priorities": 11},
        {"lease_ms": 0},
        {"overflow": "drop-tail"},
        {"max_message_bytes": 10**12},
        {"delivery_limit": 0},
        {"dead_letter_queue": "no/slash"},
        {"replicas": 3},
        {"unknown": 1},
        {"max_length": 2**80},
    ],
)
def test_invalid_arguments_are_422_and_create_nothing(
    admin: httpx.Client, args: dict[str, Any]
) -> None:
    name = f"bad-{secrets.token_hex(4)}"
    assert_problem(admin.put(f"/api/v1/queues/{name}", json=args), 422, "validation-failed")
    assert_problem(admin.get(f"/api/v1/queues/{name}"), 404, "queue-not-found")


def test_permissions(api_server: Server, admin: httpx.Client) -> None:
    q = new_queue(admin, "perm")
    other = new_queue(admin, "other")
    with user_client(api_server, admin, write="perm-.*", read="perm-.*") as app_user:
        assert_problem(
            app_user.put(f"/api/v1/queues/perm-{secrets.token_hex(3)}"), 403, "forbidden"
        )
        assert_problem(app_user.delete(f"/api/v1/queues/{q}"), 403, "forbidden")
        assert_problem(app_user.post(f"/api/v1/queues/{q}/purge"), 403, "forbidden")
        assert_problem(app_user.post(f"/api/v1/queues/{q}/snapshots"), 403, "forbidden")
        assert_problem(app_user.post(f"/api/v1/queues/{q}/compactions"), 403, "forbidden")
        published = app_user.post(
            f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]}
        )
        assert published.status_code == 201
        assert_problem(
            app_user.post(f"/api/v1/queues/{other}/messages", json={"messages": [{"body": "x"}]}),
            403,
            "forbidden",
        )
        assert app_user.get(f"/api/v1/queues/{q}").status_code == 200
        assert_problem(app_user.get(f"/api/v1/queues/{other}"), 403, "forbidden")
        listed = [x["name"] for x in app_user.get("/api/v1/queues").json()]
        assert q in listed and other not in listed
    with user_client(api_server, admin, write="perm-.*") as writer:
        assert_problem(
            writer.post(f"/api/v1/queues/{q}/messages/receive", json={}), 403, "forbidden"
        )
        assert_problem(writer.get(f"/api/v1/queues/{q}/messages"), 403, "forbidden")
        assert_problem(
            writer.post(f"/api/v1/queues/{q}/messages/ack", json={"receipts": ["0" * 64]}),
            403,
            "forbidden",
        )
    with user_client(api_server, admin, configure="perm-.*") as configurer:
        dl = {"dead_letter_queue": other}
        assert_problem(
            configurer.put(f"/api/v1/queues/perm-{secrets.token_hex(3)}", json=dl), 403, "forbidden"
        )
        assert configurer.post(f"/api/v1/queues/{q}/purge").json() == {"purged": 1}
    with api_server.client() as anonymous:
        assert_problem(anonymous.get("/api/v1/queues"), 401, "unauthorized")
        assert_problem(anonymous.put(f"/api/v1/queues/{q}"), 401, "unauthorized")
        assert_problem(anonymous.get("/api/v1/cluster"), 401, "unauthorized")
    with api_server.client("qra_not-a-token") as wrong:
        assert_problem(
            wrong.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x"}]}),
            401,
            "unauthorized",
        )


def test_snapshots_compactions_segments(admin: httpx.Client) -> None:
    q = new_queue(admin)
    for _ in range(5):
        admin.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "x" * 1000}] * 50})
    taken = admin.post(f"/api/v1/queues/{q}/snapshots")
    assert taken.status_code == 202, taken.text
    record = taken.json()
    assert record["trigger"] == "manual" and record["index"] >= 5 and record["bytes"] > 0
    history = admin.get(f"/api/v1/queues/{q}/snapshots").json()
    assert history[0] == record
    run = admin.post(f"/api/v1/queues/{q}/compactions", json={"phase": 1})
    assert run.status_code == 202, run.text
    assert run.json()["trigger"] == "manual"
    assert admin.post(f"/api/v1/queues/{q}/compactions").status_code == 202  # auto
    compactions = admin.get(f"/api/v1/queues/{q}/compactions").json()
    assert len(compactions["history"]) == 2 and compactions["history"][1] == run.json()
    assert {"segments", "bytes", "live_entries", "dead_entries"} <= set(compactions["current"])
    segments = admin.get(f"/api/v1/queues/{q}/segments")
    assert segments.status_code == 200
    for s in segments.json():
        assert s["first_index"] <= s["last_index"] and s["bytes"] > 0
    assert_problem(
        admin.post(f"/api/v1/queues/{q}/compactions", json={"phase": 4}), 422, "validation-failed"
    )
    assert_problem(admin.post("/api/v1/queues/nope-q/snapshots"), 404, "queue-not-found")
    assert_problem(admin.get("/api/v1/queues/nope-q/snapshots"), 404, "queue-not-found")
    assert_problem(admin.get("/api/v1/queues/nope-q/segments"), 404, "queue-not-found")
    actions = [(e["action"], e["target"]) for e in admin.get("/api/v1/audit").json()]
    assert ("queue.snapshot", q) in actions and ("queue.compact", q) in actions


def test_cluster_and_single_node_membership(admin: httpx.Client) -> None:
    q = new_queue(admin)
    cluster = admin.get("/api/v1/cluster").json()
    assert len(cluster["nodes"]) == 1
    me = cluster["nodes"][0]
    assert me["health"] == "up" and q in me["leads"]
    for response in (
        admin.post(f"/api/v1/queues/{q}/members", json={"node": "other"}),
        admin.delete(f"/api/v1/queues/{q}/members/{me['name']}"),
        admin.post(f"/api/v1/queues/{q}/leader", json={"node": "other"}),
    ):
        assert_problem(response, 409, "single-node-cluster")
    assert_problem(admin.post("/api/v1/queues/nope-q/leader"), 404, "queue-not-found")


def test_admin_actions_are_audited(admin: httpx.Client) -> None:
    q = new_queue(admin)
    admin.patch(f"/api/v1/queues/{q}", json={"max_length": 9})
    admin.post(f"/api/v1/queues/{q}/purge")
    admin.delete(f"/api/v1/queues/{q}")
    entries = [
        (e["action"], e["target"], e["actor"], e["source"])
        for e in admin.get("/api/v1/audit").json()
    ]
    for action in ("queue.create", "queue.policy", "queue.purge", "queue.delete"):
        assert (action, q, "admin", "api") in entries


def test_metrics_per_queue(admin: httpx.Client) -> None:
    q = new_queue(admin)
    admin.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "a"}, {"body": "b"}]})
    text = admin.get("/metrics").text
    assert f'quorra_queue_messages_ready{{queue="{q}"}} 2.0' in text
    assert f'quorra_queue_messages_published_total{{queue="{q}"}} 2.0' in text
    assert f'quorra_queue_raft_term{{queue="{q}"}}' in text
    assert f'quorra_queue_memory_bytes{{queue="{q}"}}' in text


def test_metrics_wal_sync_times(admin: httpx.Client) -> None:
    """The shared WAL's group commits are a histogram: each publish adds at least one."""

    def count() -> float:
        text = admin.get("/metrics").text
        assert 'quorra_wal_sync_seconds_bucket{le="0.01"}' in text
        assert "quorra_wal_written_bytes_total" in text
        line = next(x for x in text.splitlines() if x.startswith("quorra_wal_sync_seconds_count"))
        return float(line.split()[-1])

    q = new_queue(admin)
    before = count()
    for _ in range(3):
        admin.post(f"/api/v1/queues/{q}/messages", json={"messages": [{"body": "a"}]})
    assert count() >= before + 3


def test_automatic_checkpoints_land_in_history(admin: httpx.Client) -> None:
    """Consumed messages make dead log bytes; past ~2 MiB the engine checkpoints on its
    own and the record listener stores the run in SQLite."""
    q = new_queue(admin)
    body = {"messages": [{"body": "x" * 1024}] * 1000}
    for _ in range(3):
        assert admin.post(f"/api/v1/queues/{q}/messages", json=body).status_code == 201
        got = admin.post(f"/api/v1/queues/{q}/messages/receive", json={"max_messages": 1000})
        receipts = [m["receipt"] for m in got.json()["messages"]]
        assert admin.post(f"/api/v1/queues/{q}/messages/ack", json={"receipts": receipts}).json()[
            "settled"
        ] == len(receipts)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        history = admin.get(f"/api/v1/queues/{q}/snapshots").json()
        if any(s["trigger"] == "auto" for s in history):
            break
        time.sleep(0.1)
    auto = [s for s in history if s["trigger"] == "auto"]
    assert auto, history
    assert auto[0]["index"] > 3 and auto[0]["bytes"] > 0


def _queue_labels(metrics_text: str) -> set[str]:
    return set(re.findall(r'\{queue="([^"]+)"\}', metrics_text))


def test_cluster_and_metrics_show_only_the_queues_get_queues_lists(
    api_server: Server, admin: httpx.Client
) -> None:
    """Leaders and per-queue series follow the listing's rule; node-wide series stay."""
    mine, other = new_queue(admin, "seen"), new_queue(admin, "hidden")
    assert {mine, other} <= _queue_labels(admin.get("/metrics").text)
    with (
        user_client(api_server, admin) as nobody,
        user_client(api_server, admin, read=re.escape(mine)) as reader,
    ):
        for client, visible in ((nobody, set()), (reader, {mine})):
            listed = {q["name"] for q in client.get("/api/v1/queues").json()}
            assert listed == visible
            (node,) = client.get("/api/v1/cluster").json()["nodes"]
            assert node["health"] == "up" and set(node["leads"]) == visible
            text = client.get("/metrics").text
            assert _queue_labels(text) == visible
            assert "quorra_wal_sync_seconds_count" in text and "quorra_ready 1.0" in text
