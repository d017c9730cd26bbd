"""The seams the queue routers will use, exercised by a throwaway router in process:
permission dependencies, the node dependency, msgpack bodies and ``respond``."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import msgpack
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from app.api.deps import API_PREFIX, QueueName
from app.api.queue_deps import CanConfigure, CanRead, CanWrite, NodeDep
from app.api.tokens import issue_token
from app.db import repo
from app.main import create_app
from app.negotiation import MSGPACK_RESPONSE, NegotiatedRoute, openapi_msgpack, respond
from app.settings import Settings


class Batch(BaseModel):
    messages: list[bytes | str]


def _router() -> APIRouter:
    router = APIRouter(prefix=f"{API_PREFIX}/seam-test", route_class=NegotiatedRoute)

    @router.post(
        "/{name}/echo", responses={200: MSGPACK_RESPONSE}, openapi_extra=openapi_msgpack(Batch)
    )
    def echo(name: QueueName, body: Batch, request: Request, who: CanWrite) -> Response:
        return respond(request, {"queue": name, "by": who.name, "messages": body.messages})

    @router.get("/{name}/peek")
    def peek(name: QueueName, who: CanRead) -> dict[str, str]:
        return {"queue": name}

    @router.delete("/{name}")
    def drop(name: QueueName, who: CanConfigure, node: NodeDep) -> dict[str, str]:
        raise AssertionError("no engine: NodeDep answers first")

    return router


def test_queue_seams(tmp_path: Path) -> None:
    app = create_app(
        Settings(data_dir=tmp_path / "data", admin_password="admin-password"),
        node_factory=lambda _settings: None,  # no engine: NodeDep answers 503
    )
    app.include_router(_router())

    async def run() -> None:
        async with app.router.lifespan_context(app):
            with app.state.db.transaction() as session:
                bob = repo.create_user(
                    session,
                    name="bob",
                    password_hash="x",
                    role="user",
                    configure="",
                    write="orders.*",
                    read="orders",
                )
                token, _ = issue_token(session, bob, "")
                admin_token, _ = issue_token(session, repo.get_user(session, "admin"), "")  # type: ignore[arg-type]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await _check(client, token, admin_token)

    anyio.run(run)


async def _check(client: httpx.AsyncClient, token: str, admin_token: str) -> None:
    bob = {"Authorization": f"Bearer {token}"}
    admin = {"Authorization": f"Bearer {admin_token}"}
    url = f"{API_PREFIX}/seam-test"

    assert (await client.post(f"{url}/orders-1/echo", json={"messages": ["a"]})).status_code == 401
    forbidden = await client.post(f"{url}/events/echo", json={"messages": ["a"]}, headers=bob)
    assert forbidden.status_code == 403 and forbidden.json()["type"] == "/problems/forbidden"
    bad_name = await client.post(f"{url}/bad%20name/echo", json={"messages": []}, headers=bob)
    assert bad_name.status_code == 422

    as_json = await client.post(f"{url}/orders-1/echo", json={"messages": ["hi"]}, headers=bob)
    assert as_json.json() == {"queue": "orders-1", "by": "bob", "messages": ["hi"]}
    packed = await client.post(
        f"{url}/orders-1/echo",
        content=msgpack.packb({"messages": [b"\x00\xff", "text"]}),
        headers=bob | {"Content-Type": "application/msgpack", "Accept": "application/msgpack"},
    )
    assert packed.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(packed.content) == {
        "queue": "orders-1",
        "by": "bob",
        "messages": [b"\x00\xff", "text"],
    }
    binary_as_json = await client.post(
        f"{url}/orders-1/echo",
        content=msgpack.packb({"messages": [b"\x00\xff"]}),
        headers=bob | {"Content-Type": "application/msgpack"},
    )
    assert binary_as_json.json()["messages"] == ["AP8="]

    assert (await client.get(f"{url}/orders/peek", headers=bob)).status_code == 200
    assert (await client.get(f"{url}/orders-1/peek", headers=bob)).status_code == 403  # full match
    assert (await client.delete(f"{url}/orders", headers=bob)).status_code == 403
    no_engine = await client.delete(f"{url}/orders", headers=admin)
    assert no_engine.status_code == 503 and no_engine.headers["retry-after"] == "1"
    assert no_engine.json()["type"] == "/problems/no-leader"

    spec = (await client.get("/openapi.json")).json()["paths"][f"{url}/{{name}}/echo"]["post"]
    assert set(spec["requestBody"]["content"]) == {"application/json", "application/msgpack"}
    assert spec["requestBody"]["content"]["application/msgpack"]["schema"] == {
        "$ref": "#/components/schemas/Batch"
    }
