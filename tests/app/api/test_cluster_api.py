"""The cluster endpoints on a three-node cluster: the app hosts node n1, two more nodes
run in the same process behind the in-memory transport (real Raft replication)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx

from app.api.tokens import issue_token
from app.db import repo
from app.main import create_app
from app.settings import Settings
from engine.runtime import InMemoryNetwork, Node
from tests.engine.runtime.util import FAST as RUNTIME_FAST

NAMES = ["n1", "n2", "n3"]
FAST = dataclasses.replace(RUNTIME_FAST, proposal_timeout_ms=RUNTIME_FAST.leader_wait_ms)


async def _retry(call: object, timeout_s: float = 10.0) -> httpx.Response:
    """Retry while the queue has no leader yet (503 no-leader)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response: httpx.Response = await call()  # type: ignore[operator]
        if response.status_code != 503 or asyncio.get_running_loop().time() > deadline:
            return response
        await asyncio.sleep(0.05)


def _run_cluster(
    tmp_path: Path,
    names: list[str],
    body: Callable[[httpx.AsyncClient, list[Node]], Awaitable[None]],
) -> None:
    """The app hosts ``names[0]``; the other nodes run beside it. ``body`` gets an admin
    client of the app and the other nodes, which it may stop."""
    network = InMemoryNetwork(names)
    settings = Settings(
        data_dir=tmp_path / names[0],
        admin_password="admin-password",
        node_name=names[0],
        limits=FAST,
    )

    def node_factory(s: Settings) -> Node:
        return Node(
            s.data_dir, node_name=names[0], limits=FAST, transport=network.transport(names[0])
        )

    app = create_app(settings, node_factory=node_factory)

    async def run() -> None:
        others = [
            Node(tmp_path / n, node_name=n, limits=FAST, transport=network.transport(n))
            for n in names[1:]
        ]
        await asyncio.gather(*(n.start() for n in others))
        try:
            async with app.router.lifespan_context(app):
                with app.state.db.transaction() as session:
                    admin = repo.get_user(session, "admin")
                    assert admin is not None
                    token, _ = issue_token(session, admin, "")
                transport = httpx.ASGITransport(app=app)
                headers = {"Authorization": f"Bearer {token}"}
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://t", headers=headers, timeout=30
                ) as client:
                    await body(client, others)
        finally:
            await asyncio.gather(*(n.stop() for n in others))

    anyio.run(run)


def test_three_node_cluster_leader_transfer(tmp_path: Path) -> None:
    async def body(client: httpx.AsyncClient, others: list[Node]) -> None:
        await _check(client)
        await asyncio.gather(*(n.stop() for n in others))
        await _no_quorum(client)

    _run_cluster(tmp_path, NAMES, body)


def _members(queue: httpx.Response) -> list[str]:
    return sorted(m["node"] for m in queue.json()["stats"]["raft"]["members"])


def test_members_are_added_and_removed_one_at_a_time(tmp_path: Path) -> None:
    """On four nodes a queue of three replicas gains the fourth node (which then holds
    the messages) and loses another (whose replica is deleted); the audit log has both."""
    names = ["n1", "n2", "n3", "n4"]

    async def body(client: httpx.AsyncClient, others: list[Node]) -> None:
        assert (await client.put("/api/v1/queues/mq", json={"replicas": 3})).status_code == 201
        sent = {"messages": [{"body": f"m{i}"} for i in range(3)]}
        published = await _retry(lambda: client.post("/api/v1/queues/mq/messages", json=sent))
        assert published.status_code == 201, published.text
        before = _members(await client.get("/api/v1/queues/mq"))
        spare = next(n for n in names if n not in before)
        added = await _retry(lambda: client.post("/api/v1/queues/mq/members", json={"node": spare}))
        assert added.status_code == 200, added.text
        assert _members(added) == sorted([*before, spare])
        again = await client.post("/api/v1/queues/mq/members", json={"node": spare})
        assert again.status_code == 409 and again.json()["type"] == "/problems/queue-conflict"
        unknown = await client.post("/api/v1/queues/mq/members", json={"node": "n9"})
        assert unknown.status_code == 422, unknown.text

        gone = next(n for n in before if n != "n1")
        removed = await _retry(lambda: client.delete(f"/api/v1/queues/mq/members/{gone}"))
        assert removed.status_code == 200, removed.text
        assert _members(removed) == sorted(n for n in [*before, spare] if n != gone)
        by_name = {n.name: n for n in others}
        assert "mq" not in {q.name for q in by_name[gone].queues()}
        if spare != "n1":
            assert "mq" in {q.name for q in by_name[spare].queues()}
        wanted = {"max_messages": 10}
        received = await _retry(
            lambda: client.post("/api/v1/queues/mq/messages/receive", json=wanted)
        )
        assert sorted(m["body"] for m in received.json()["messages"]) == ["m0", "m1", "m2"]

        audit = (await client.get("/api/v1/audit")).json()
        actions = [
            (e["action"], e["detail"]) for e in audit if e["action"].startswith("queue.member")
        ]
        assert sorted(actions) == [
            ("queue.member.add", {"node": spare}),
            ("queue.member.remove", {"node": gone}),
        ]

    _run_cluster(tmp_path, names, body)


async def _check(client: httpx.AsyncClient) -> None:
    created = await client.put("/api/v1/queues/rq")
    assert created.status_code == 201 and created.json()["arguments"]["replicas"] == 3
    published = await _retry(
        lambda: client.post("/api/v1/queues/rq/messages", json={"messages": [{"body": "x"}]})
    )
    assert published.status_code == 201, published.text

    cluster = (await client.get("/api/v1/cluster")).json()
    assert sorted(n["name"] for n in cluster["nodes"]) == NAMES
    queue = await client.get("/api/v1/queues/rq")
    leader = queue.json()["stats"]["raft"]["leader"]
    # Every answer about the queue names its leader, the hot publish path's too.
    assert queue.headers["quorra-leader"] == leader
    again = await client.post("/api/v1/queues/rq/messages", json={"messages": [{"body": "z"}]})
    assert again.status_code == 201 and again.headers["quorra-leader"] == leader
    assert "quorra-leader" not in (await client.get("/api/v1/queues/nope")).headers
    target = next(n for n in NAMES if n != leader)
    moved = await _retry(lambda: client.post("/api/v1/queues/rq/leader", json={"node": target}))
    assert moved.status_code == 200, moved.text
    assert moved.json() == {"leader": target}
    assert (await client.get("/api/v1/queues/rq")).json()["stats"]["raft"]["leader"] == target

    audit = (await client.get("/api/v1/audit")).json()
    assert [e["detail"] for e in audit if e["action"] == "queue.leader"] == [{"node": target}]
    anyone = await _retry(lambda: client.post("/api/v1/queues/rq/leader"))
    assert anyone.status_code == 200 and anyone.json()["leader"] != target


async def _no_quorum(client: httpx.AsyncClient) -> None:
    """With two of three nodes down, a publish cannot commit: 503 with Retry-After."""
    response = await client.post("/api/v1/queues/rq/messages", json={"messages": [{"body": "y"}]})
    assert response.status_code == 503, response.text
    # Refused at once, or appended and then lost with the leadership: both say retry.
    assert response.json()["type"] in ("/problems/no-leader", "/problems/outcome-unknown")
    assert response.headers["retry-after"] == "1"


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def test_the_cluster_page_shows_links_and_leaders_and_moves_a_leadership(tmp_path: Path) -> None:
    async def body(client: httpx.AsyncClient, others: list[Node]) -> None:
        assert (await client.put("/api/v1/queues/pq")).status_code == 201
        leader = await _leader(client, "pq")
        page = await client.get("/login")
        token = CSRF.search(page.text)
        assert token is not None
        form = {"username": "admin", "password": "admin-password", "csrf_token": token[1]}
        assert (await client.post("/login", data=form)).status_code in (200, 303)
        shown = await client.get("/cluster")
        assert shown.status_code == 200
        for name in NAMES:
            assert f'<tr data-node="{name}">' in shown.text
        assert shown.text.count("connected</span>") >= 2, "both peers' links are up"
        assert '<tr data-queue="pq">' in shown.text
        csrf = CSRF.search(shown.text)
        assert csrf is not None
        target = next(n for n in NAMES if n != leader)
        moved = await client.post(
            "/cluster/leader",
            data={"queue": "pq", "node": target},
            headers={"X-CSRF-Token": csrf[1]},
        )
        assert moved.status_code == 200 and f"{target} leads pq now" in moved.text, moved.text
        assert await _leader(client, "pq") == target
        refused = await client.post(
            "/cluster/leader",
            data={"queue": "nope", "node": target},
            headers={"X-CSRF-Token": csrf[1]},
        )
        assert refused.status_code == 404

    _run_cluster(tmp_path, NAMES, body)


async def _leader(client: httpx.AsyncClient, name: str) -> str:
    for _ in range(200):
        leader = (await client.get(f"/api/v1/queues/{name}")).json()["stats"]["raft"]["leader"]
        if leader is not None:
            return str(leader)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no leader of {name}")
