"""``MessageRoute``: how the message endpoints (publish, receive, ack, nack, extend) are
served, inside the whole middleware stack and without FastAPI's per-request machinery.

These endpoints are most of a busy server's requests, and FastAPI's dependency solving
and pydantic validation cost more server time than the engine's work on them (profiled
with ``quorra bench rest --profile``). A ``MessageRoute`` is an ordinary route of the
app's router, so every middleware applies to it (security headers, request metrics
under its template, the body limit, the name guard) and its errors are rendered by the
app's problem handlers; only its handler differs: the endpoint is called with the queue
name and the request, and reads the body itself through the one parser of message
bodies (app/api/message_bodies.py), after ``admitted``. FastAPI still describes the
route in OpenAPI from the endpoint's signature, the ``body_model`` (JSON and
MessagePack) and the bearer scheme; it neither solves dependencies nor validates the
body at run time. The message routes come first in the routing table
(``app.queue_api.install``), so that finding them costs a handful of regex matches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Depends, Request, Response
from fastapi.params import Body
from fastapi.routing import APIRoute
from fastapi.utils import create_model_field
from pydantic import BaseModel

from app.api.deps import BEARER_SCHEME, bearer_principal
from app.api.message_bodies import decoded
from app.api.queue_deps import get_node
from app.auth import Permission, Principal, require
from app.negotiation import openapi_msgpack
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
        endpoint: MessageEndpoint = self.endpoint

        async def handle(request: Request) -> Response:
            return await endpoint(request.path_params["name"], request)

        return handle


async def admitted(
    request: Request, name: str, permission: Permission
) -> tuple[object, Principal, QueueEngine]:
    """The body's value, the caller and the engine, checked in the order every
    endpoint answers: the body's media type (415) and syntax (400), the bearer token
    (401), ``permission`` on the queue (403), a running engine (503). The body's fields
    are the endpoint's to parse (422, 400, 413)."""
    headers = request.headers
    payload = decoded(headers.get("content-type", ""), await request.body())
    who = await bearer_principal(request.app.state, headers.get("authorization", ""))
    require(who, permission, name)
    return payload, who, await get_node(request)
