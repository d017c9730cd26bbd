"""Routes added to the app as they were built (see ``add_routes``)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Route


def add_routes(app: FastAPI, *routers: APIRouter, first: bool = False) -> None:
    """Add the routers' routes to ``app`` as they were built.

    ``include_router`` would wrap each router in an inclusion context whose routes
    FastAPI builds a second time (every parameter's and response's validator), lazily,
    on the first request that walks them: ~50 ms of a new server's first requests
    (``quorra bench restart``, ``empty_start_ms``). Quorra's routers carry their full
    paths and settings and include no routers of their own, so nothing is lost.

    ``first``: ahead of every route the app has so far. The router tries routes in order
    (a regex match each), so the busiest endpoints go first."""
    added: list[BaseRoute] = []
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute | Route):
                raise TypeError(f"{route!r}: only routes are added as they are")
            added.append(route)
    if first:
        app.router.routes[:0] = added
    else:
        app.router.routes.extend(added)
