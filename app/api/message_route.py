"""``MessageRoute`` and ``MessageDispatch``: how the message endpoints (publish, receive,
ack, nack, extend) are served, inside the whole middleware stack and without FastAPI's
per-request machinery.

These endpoints are most of a busy server's requests, and FastAPI's dependency solving
and pydantic validation cost more server time than the engine's work on them (profiled
with ``quorra bench rest --profile``). A ``MessageRoute`` is a route of the app's router,
documented by FastAPI in OpenAPI from the endpoint's signature, the ``body_model`` (JSON
and MessagePack) and the bearer scheme; at run time FastAPI neither solves its
dependencies nor validates its body: the endpoint is called with the queue name and the
request, and reads the body itself through the one parser of message bodies
(app/api/message_bodies.py), after ``admitted``.

``MessageDispatch`` is the innermost middleware (inside the security headers, the request
metrics, the body limit and the name guard, which all apply): it finds a message
route by the path's shape instead of the router's walk, sets ``scope["route"]`` (the
metrics' template) and ``path_params`` as the router would, calls the same endpoint and
renders its errors with the app's own handlers (``problem_of``). What it does not match
goes on to the router, where the same routes answer the same way: the dispatch saves the
exception middleware, the router and Starlette's request-response wrapping (together
about a fifth of the app's CPU per message request, the engine stubbed out), nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple

from fastapi import Depends, Request, Response
from fastapi.params import Body
from fastapi.routing import APIRoute
from fastapi.utils import create_model_field
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.deps import BEARER_SCHEME, bearer_principal, cached_bearer_principal
from app.api.message_bodies import decoded
from app.api.queue_deps import running_node
from app.auth import Permission, Principal, require
from app.negotiation import openapi_msgpack, prefers_msgpack
from app.problems import problem_of
from engine.runtime.api import QueueEngine

MessageEndpoint = Callable[[str, Request], Awaitable[Response]]


class MessageRoute(APIRoute):
    """A ``POST`` message endpoint ``(name, request) -> Response``; see the module."""

    def __init__(
        self, path: str, endpoint: MessageEndpoint, *, body_model: type[BaseModel], **kwargs: Any
    ) -> None:
        super().__init__(
            path,
            endpoint,
            methods=["POST"],
            dependencies=[Depends(BEARER_SCHEME)],  # for OpenAPI: ``admitted`` checks it
            openapi_extra=openapi_msgpack(body_model),
            **kwargs,
        )
        # For OpenAPI only: the body the endpoint parses (required, JSON; MessagePack
        # is added by ``openapi_extra``). The handler below never reads this field.
        self.body_field = create_model_field(
            "body", body_model, field_info=Body(annotation=body_model)
        )

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return self.serve

    async def serve(self, request: Request) -> Response:
        endpoint: MessageEndpoint = self.endpoint
        return await endpoint(request.path_params["name"], request)


class MessageDispatch:
    """The innermost middleware: message requests straight to their ``MessageRoute``."""

    def __init__(self, app: ASGIApp, routes: list[MessageRoute], prefix: str) -> None:
        self.app = app
        self.prefix = prefix
        """The routes' common start, up to ``{name}``."""
        self.routes: dict[str, MessageRoute] = {}
        """What follows ``{name}`` -> its route."""
        for route in routes:
            head, name, tail = route.path.partition("{name}")
            assert head == prefix and name, route.path
            self.routes[tail] = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = self._match(scope)
        if matched is None:
            await self.app(scope, receive, send)
            return
        route, name = matched
        request = Request(scope, receive, send)
        try:
            # The endpoint itself, with the name just matched: what ``route.serve`` does,
            # without its coroutine and the read of ``path_params`` back from the scope.
            endpoint: MessageEndpoint = route.endpoint
            response = await endpoint(name, request)
        except Exception as e:
            response = problem_of(request, e)
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[MessageRoute, str] | None:
        """The route the router would choose and the queue's name, or None when the
        router should choose (another method, another path, a mounted app)."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not path.startswith(self.prefix):
            return None
        name, slash, rest = path[len(self.prefix) :].partition("/")
        route = self.routes.get(slash + rest)
        if route is None or not name:
            return None
        scope["route"] = route
        scope["path_params"] = {"name": name}
        return route, name


async def _body(request: Request) -> bytes:
    """The whole body, as ``request.body()`` reads it (through the body limit's
    ``receive``) without its async generator, on every message request."""
    chunks: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class Admitted(NamedTuple):
    """A tuple, not a frozen dataclass: built on every message request, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``."""

    payload: object
    """The body's value (app/api/message_bodies.py ``decoded``)."""
    who: Principal
    node: QueueEngine
    binary: bool
    """Whether to answer in MessagePack (``Accept``)."""


async def admitted(request: Request, name: str, permission: Permission) -> Admitted:
    """The body's value, the caller and the engine, checked in the order every
    endpoint answers: the body's media type (415) and syntax (400), the bearer token
    (401), ``permission`` on the queue (403), a running engine (503). The body's fields
    are the endpoint's to parse (422, 400, 413).

    The three headers are read in one pass over the raw list: ``request.headers`` would
    scan it once per header, a cost on every message request."""
    content_type = authorization = accept = b""
    for key, value in request.scope["headers"]:
        if key == b"content-type":
            content_type = value
        elif key == b"authorization":
            authorization = value
        elif key == b"accept":
            accept = value
    payload = decoded(content_type.decode("latin-1"), await _body(request))
    state = request.app.state
    bearer = authorization.decode("latin-1")
    who = cached_bearer_principal(state, bearer) or await bearer_principal(state, bearer)
    require(who, permission, name)
    node = running_node(state)
    return Admitted(payload, who, node, bool(accept) and prefers_msgpack(accept.decode("latin-1")))
