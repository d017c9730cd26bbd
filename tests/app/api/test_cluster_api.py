"""The cluster endpoints on a three-node cluster: the app hosts node n1, two more nodes
run in the same process behind the in-memory transport (real Raft replication)."""

from __future__ import annotations

import asyncio
import dataclasses
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


def test_three_node_cluster_leader_transfer(tmp_path: Path) -> None:
    network = InMemoryNetwork(NAMES)
    settings = Settings(
        data_dir=tmp_path / "n1", admin_password="admin-password", node_name="n1", limits=FAST
    )

    def node_factory(s: Settings) -> Node:
        return Node(s.data_dir, node_name="n1", limits=FAST, transport=network.transport("n1"))

    app = create_app(settings, node_factory=node_factory)

    async def run() -> None:
        others = [
            Node(tmp_path / n, node_name=n, limits=FAST, transport=network.transport(n))
            for n in NAMES[1:]
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
                    await _check(client)
                    await asyncio.gather(*(n.stop() for n in others))
                    await _no_quorum(client)
        finally:
            await asyncio.gather(*(n.stop() for n in others))

    anyio.run(run)


async def _check(client: httpx.AsyncClient) -> None:
    created = await client.put("/api/v1/queues/rq")
    assert created.status_code == 201 and created.json()["arguments"]["replicas"] == 3
    published = await _retry(
        lambda: client.post("/api/v1/queues/rq/messages", json={"messages": [{"body": "x"}]})
    )
    assert published.status_code == 201, published.text

    cluster = (await client.get("/api/v1/cluster")).json()
    assert sorted(n["name"] for n in cluster["nodes"]) == NAMES
    raft = (await client.get("/api/v1/queues/rq")).json()["stats"]["raft"]
    leader = raft["leader"]
    target = next(n for n in NAMES if n != leader)
    moved = await _retry(lambda: client.post("/api/v1/queues/rq/leader", json={"node": target}))
    assert moved.status_code == 200, moved.text
    assert moved.json() == {"leader": target}
    assert (await client.get("/api/v1/queues/rq")).json()["stats"]["raft"]["leader"] == target

    audit = (await client.get("/api/v1/audit")).json()
    assert [e["detail"] for e in audit if e["action"] == "queue.leader"] == [{"node": target}]
    anyone = await _retry(lambda: client.post("/api/v1/queues/rq/leader"))
    assert anyone.status_code == 200 and anyone.json()["leader"] != target

    members = await client.post("/api/v1/queues/rq/members", json={"node": "n4"})
    assert members.status_code == 501
    assert members.json()["type"] == "/problems/not-implemented"


async def _no_quorum(client: httpx.AsyncClient) -> None:
    """With two of three nodes down, a publish cannot commit: 503 with Retry-After."""
    response = await client.post("/api/v1/queues/rq/messages", json={"messages": [{"body": "y"}]})
    assert response.status_code == 503, response.text
    assert response.json()["type"] == "/problems/no-leader"
    assert response.headers["retry-after"] == "1"
