"""A real Quorra server (``quorra serve``) on 127.0.0.1 with a temporary data directory,
real SQLite and the real engine; helpers shared by the queue and message API tests."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.conftest import ADMIN_PASSWORD, Server, make_token

__all__ = ["ADMIN_PASSWORD", "PROBLEM", "Server", "assert_problem", "make_token", "new_queue"]

PROBLEM = "application/problem+json"
MSGPACK = "application/msgpack"


def assert_problem(response: httpx.Response, status: int, problem: str) -> dict[str, Any]:
    """An RFC 9457 problem of the given status and type, and no stack trace."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["type"] == f"/problems/{problem}", body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"]
    assert "Traceback" not in response.text
    return dict(body)


def new_queue(client: httpx.Client, prefix: str = "q", **arguments: Any) -> str:
    """A fresh queue with ``arguments``; returns its name."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    response = client.put(f"/api/v1/queues/{name}", json=arguments)
    assert response.status_code == 201, response.text
    return name


def kill_hard(server: Server) -> None:
    """SIGKILL: no shutdown code runs."""
    server.kill()


@pytest.fixture(scope="session")
def api_server(server: Server) -> Server:
    """The session's server (``tests/app/conftest.py``), shared with every REST test."""
    return server


@pytest.fixture()
def fresh_server(tmp_path: Path) -> Iterator[Server]:
    """A server of its own, for tests that stop, kill and restart it."""
    srv = Server(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.stop()


def stats(client: httpx.Client, queue: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/queues/{queue}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["stats"]
    return result
