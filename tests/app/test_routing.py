"""The app's routes are the routers' own, built once: no inclusion context for FastAPI
to build again on the first requests after a start."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route, WebSocketRoute

from app.main import create_app
from app.routing import add_routes
from app.settings import Settings


def test_every_route_of_the_app_is_a_route_as_built(tmp_path: Path) -> None:
    app = create_app(Settings.from_env(data_dir=tmp_path, host="127.0.0.1", port=1))
    # A WebSocketRoute (the stream) has no validators for FastAPI to build again.
    routes = app.router.routes
    assert all(isinstance(route, APIRoute | Route | WebSocketRoute | Mount) for route in routes)
    sockets = {route.path for route in routes if isinstance(route, WebSocketRoute)}
    assert sockets == {"/api/v1/queues/{name}/stream"}
    paths = {route.path for route in app.router.routes if isinstance(route, APIRoute)}
    assert {"/api/v1/tokens", "/api/v1/queues/{name}", "/queues/{name}"} <= paths


def test_a_router_that_includes_routers_is_refused() -> None:
    inner = APIRouter()

    @inner.get("/x")
    def x() -> dict[str, str]:
        return {}

    outer = APIRouter()
    outer.include_router(inner)
    with pytest.raises(TypeError, match="only routes"):
        add_routes(FastAPI(), outer)
