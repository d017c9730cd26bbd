"""The hot message endpoints without FastAPI's per-request machinery.

Publish, receive, ack, nack and extend (``POST /api/v1/queues/{name}/messages[/...]``)
are most of a busy server's requests, and FastAPI's routing, dependency solving and
pydantic validation cost more server time than the engine's work on them (profiled
with ``quorra bench rest --profile``). ``HotPaths``, the outermost layer of the app,
answers those requests itself when they are well-formed: the body parsed once
(app/api/hot_bodies.py), the token from the principal cache, the engine called through
the same functions as the routes (app/api/messages.py), the answer encoded once.

Rule: it answers only requests that reach the engine. Any other request, and any it is
not sure of (a name that needs decoding, a body over the limit, another content type, a
body that does not parse or that hot_bodies does not accept, a missing or refused token,
no permission, no engine), goes on to the app behind it with the body it read replayed,
and the app's routes and middlewares answer it. So every refusal before the engine has
one source, and ``HotPaths`` renders only the engine's answers and typed errors, as the
app's handlers do. It adds what the app's middlewares add to every answer (security
headers, request metrics under the route's template). The FastAPI routes stay: they
document the endpoints in OpenAPI and answer the rest; tests/app/test_hot_paths.py
sends the same requests both ways and compares the answers.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import orjson
from prometheus_client import Counter
from starlette.datastructures import State
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import hot_bodies, messages
from app.api.deps import API_PREFIX, bearer_principal
from app.auth import Permission, Principal
from app.negotiation import JSON, MSGPACK_ALIASES, media_type, prefers_msgpack, unpackb
from app.problems import AppProblem, problem_response, typed_problem
from app.state import hot_path_stats_of, metrics_of, node_or_none, settings_of
from engine.errors import InvalidRequest, QuorraError
from engine.runtime.api import QueueEngine

log = logging.getLogger("quorra.app")

QUEUES_PREFIX = f"{API_PREFIX}/queues/".encode()
_NAME = re.compile(rb"[A-Za-z0-9._-]{1,200}")
"""As sent: no percent-escapes (those go the long way, through QueueNameGuard)."""
UNADDRESSABLE_NAMES = frozenset({b".", b".."})
MESSAGES_TEMPLATE = f"{API_PREFIX}/queues/{{name}}/messages"
KINDS = {
    b"": "publish",
    b"/receive": "receive",
    b"/ack": "ack",
    b"/nack": "nack",
    b"/extend": "extend",
}
"""Path after ``/messages`` -> endpoint."""
PERMISSION: dict[str, Permission] = {
    "publish": "write",
    "receive": "read",
    "ack": "read",
    "nack": "read",
    "extend": "read",
}


@dataclass(slots=True)
class HotPathStats:
    """In ``app.state.hot_paths``: a switch (tests compare both ways) and a count."""

    enabled: bool = True
    served: int = 0


class _Decline(Exception):
    """Not answered here: the app behind answers."""


@dataclass(slots=True)
class _Request:
    kind: str
    name: str
    template: str
    content_type: str
    authorization: str
    accept: str


class HotPaths:
    def __init__(
        self,
        app: ASGIApp,
        state: State,
        body_bytes_max: int,
        extra_headers: Iterable[tuple[bytes, bytes]],
    ) -> None:
        self.app = app
        self.state = state
        self.body_bytes_max = body_bytes_max
        self.extra_headers = list(extra_headers)
        self.stats = hot_path_stats_of(state)
        metrics = metrics_of(state)
        self._requests: Counter = metrics.http_requests
        self._counted: dict[tuple[str, int], Counter] = {}
        self._durations = {
            kind: metrics.http_request_duration.labels("POST", MESSAGES_TEMPLATE + suffix.decode())
            for suffix, kind in KINDS.items()
        }
        routes = {getattr(route, "path", "") for route in messages.router.routes}
        assert {MESSAGES_TEMPLATE + s.decode() for s in KINDS} <= routes, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = self._match(scope) if self.stats.enabled else None
        if request is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        read: list[Message] = []
        try:
            status = await self._serve(request, read, receive, send)
        except _Decline:
            await self.app(scope, _replay(read, receive), send)
            return
        self.stats.served += 1
        self._count(request, status, time.perf_counter() - started)

    def _match(self, scope: Scope) -> _Request | None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        raw: bytes = scope.get("raw_path") or b""
        if not raw.startswith(QUEUES_PREFIX) or scope.get("root_path"):
            return None
        name, sep, rest = raw[len(QUEUES_PREFIX) :].partition(b"/messages")
        kind = KINDS.get(rest) if sep else None
        if kind is None or not _NAME.fullmatch(name) or name in UNADDRESSABLE_NAMES:
            return None
        content_type = authorization = accept = ""
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = value.decode("latin-1")
            elif key == b"authorization":
                authorization = value.decode("latin-1")
            elif key == b"accept":
                accept = value.decode("latin-1")
            elif key == b"content-length":
                if not value.isdigit() or int(value) > self.body_bytes_max:
                    return None  # BodyLimitMiddleware answers
            elif key == b"transfer-encoding":
                return None
        template = MESSAGES_TEMPLATE + rest.decode()
        return _Request(kind, name.decode(), template, content_type, authorization, accept)

    async def _serve(
        self, request: _Request, read: list[Message], receive: Receive, send: Send
    ) -> int:
        payload = _decoded(request.content_type, await self._body(read, receive))
        try:
            who = await bearer_principal(self.state, request.authorization)
        except Exception:
            raise _Decline from None  # the route answers 401 (or why it failed)
        node = node_or_none(self.state)
        if node is None or not who.can(PERMISSION[request.kind], request.name):
            raise _Decline
        binary = prefers_msgpack(request.accept) if request.accept else False
        try:
            call = self._call(request, payload, node, who, binary)
        except _Decline:
            raise
        except Exception as e:  # a body the parsers did not foresee: the route answers
            raise _Decline from e
        try:
            answer = await call()
        except (QuorraError, AppProblem) as e:
            return await self._send_response(typed_problem(e), send)
        except Exception as e:
            log.error("unexpected error in POST %s", request.template, exc_info=e)
            failed = problem_response(
                500, "/problems/internal", "Internal error", "the server failed; see its log"
            )
            return await self._send_response(failed, send)
        if isinstance(answer, Response):
            return await self._send_response(answer, send)
        status = 201 if request.kind == "publish" else 200
        body, content_type = messages.encoded(answer, binary)
        await self._send(send, status, body, content_type.encode(), [])
        return status

    def _call(
        self, request: _Request, payload: object, node: QueueEngine, who: Principal, binary: bool
    ) -> Callable[[], Awaitable[Response | dict[str, object]]]:
        """The engine call for a valid body; ``_Decline`` for any other."""
        kind, name = request.kind, request.name
        if kind == "publish":
            limits = settings_of(self.state).limits
            batch = hot_bodies.publish_messages(payload, limits)
            if batch is None:
                raise _Decline
            return lambda: messages.publish_batch(node, name, batch)
        if kind == "receive":
            args = hot_bodies.receive_args(payload)
            if args is None:
                raise _Decline
            return lambda: messages.receive_batch(
                node,
                name,
                who,
                max_messages=args.max_messages,
                wait_ms=args.wait_ms,
                lease_ms=args.lease_ms,
                consumer=args.consumer,
                ack=args.ack,
                binary=binary,
            )
        settle = hot_bodies.settle_args(kind, payload)
        if settle is None:
            raise _Decline
        return lambda: messages.settle(
            node, name, kind, settle.receipts, requeue=settle.requeue, lease_ms=settle.lease_ms
        )

    async def _body(self, read: list[Message], receive: Receive) -> bytes:
        """The whole body; every message taken is kept in ``read`` for a replay."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                raise _Decline
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.body_bytes_max:
                raise _Decline
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _send_response(self, response: Response, send: Send) -> int:
        headers = response.raw_headers
        await self._send(send, response.status_code, bytes(response.body), None, headers)
        return response.status_code

    async def _send(
        self,
        send: Send,
        status: int,
        body: bytes,
        content_type: bytes | None,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        if content_type is not None:
            headers = [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", content_type),
            ]
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": headers + self.extra_headers,
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _count(self, request: _Request, status: int, seconds: float) -> None:
        key = (request.kind, status)
        counter = self._counted.get(key)
        if counter is None:
            counter = self._counted[key] = self._requests.labels(
                "POST", request.template, str(status)
            )
        counter.inc()
        self._durations[request.kind].observe(seconds)


def _decoded(content_type: str, raw: bytes) -> object:
    """The body as the route would parse it, or ``_Decline``.

    JSON is parsed by orjson (two to three times faster than the standard library, which
    the route uses). Where the two differ orjson refuses (a byte-order mark, lone
    surrogates, NaN, numbers out of range) and the route parses again, except for integers
    beyond 64 bits, which orjson reads as floats; hot_bodies takes only ``int`` values, so
    those go to the route as well.
    """
    if not raw:
        raise _Decline
    kind = media_type(content_type)
    try:
        if kind == JSON:
            return orjson.loads(raw)
        if kind in MSGPACK_ALIASES:
            return unpackb(raw)
    except (ValueError, InvalidRequest):
        raise _Decline from None
    raise _Decline


def _replay(read: list[Message], receive: Receive) -> Receive:
    """``receive`` that hands out ``read`` first."""
    pending = list(read)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
