"""Every integer query and path parameter of the API and the dashboard is bounded: a
value beyond its range is a 422 problem, never a value handed on to SQLite or the engine.

The parameters are found by walking the app's routes, so a parameter added later is
checked too."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import httpx
import pytest
from fastapi.routing import APIRoute

from app.main import create_app
from app.settings import Settings
from tests.app.api.conftest import assert_problem, new_queue
from tests.app.conftest import Server
from tests.app.test_ui import log_in

pytestmark = pytest.mark.integration

HUGE = ("9223372036854775808", "-9223372036854775809", "1" + "0" * 40)
"""Just beyond a signed 64-bit integer, both ways, and far beyond."""


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every endpoint, through included routers (FastAPI keeps the router it included)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        else:
            inner = getattr(route, "original_router", route)
            yield from _routes(list(getattr(inner, "routes", [])))


def _params(dependant: Any) -> Iterator[Any]:
    yield from dependant.path_params
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _params(sub)


def _is_int(annotation: Any) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_int(a) for a in get_args(annotation))
    return annotation is int


def integer_parameters(tmp_path: Path) -> list[tuple[str, str, str, bool]]:
    """``(method, path, parameter, in_path)`` for each integer parameter of the app."""
    app = create_app(Settings(data_dir=tmp_path / "d"), node_factory=lambda s: None)
    found = set()
    for route in _routes(app.routes):
        for param in _params(route.dependant):
            if _is_int(param.field_info.annotation):
                in_path = "{" + param.name + "}" in route.path
                for method in sorted(route.methods):
                    found.add((method, route.path, param.name, in_path))
    return sorted(found)


def test_the_walk_finds_the_parameters_known_today(tmp_path: Path) -> None:
    names = {(path, name) for _m, path, name, _p in integer_parameters(tmp_path)}
    assert {
        ("/api/v1/audit", "before"),
        ("/api/v1/audit", "limit"),
        ("/api/v1/queues/{name}/messages", "after"),
        ("/api/v1/queues/{name}/messages", "limit"),
        ("/queues/{name}/messages", "after"),
    } <= names


def test_every_integer_parameter_refuses_a_huge_value(
    server: Server, admin: httpx.Client, tmp_path: Path
) -> None:
    queue = new_queue(admin, "bounds")
    fill = {"name": queue, "user_name": "admin", "token_id": "x", "node_name": "n"}
    with httpx.Client(base_url=server.url, timeout=10.0) as dashboard:
        assert log_in(dashboard).status_code == 303
        for method, path, name, in_path in integer_parameters(tmp_path):
            client = admin if path.startswith("/api/") else dashboard
            for value in HUGE:
                url = path.format(**(fill | ({name: value} if in_path else {})))
                params = {} if in_path else {name: value}
                response = client.request(method, url, params=params)
                body = assert_problem(response, 422, "validation-failed")
                assert [e["loc"][-1] for e in body["errors"]] == [name], (method, url, body)
