"""JSON or MessagePack bodies, chosen by ``Content-Type`` (requests) and ``Accept``
(responses).

Requests: a router built with ``route_class=NegotiatedRoute`` accepts
``application/msgpack`` wherever it accepts JSON. The MessagePack body is decoded
before FastAPI sees it and then validated by the same pydantic model, so endpoints
declare one body parameter and the OpenAPI schema stays exact; ``bytes`` fields take
raw binary from MessagePack. Malformed MessagePack is 400; another media type is 415.

Responses: when ``Accept`` prefers MessagePack, the JSON answer of a negotiated route
is re-encoded as MessagePack. Endpoints with binary fields or on hot paths return
``respond(request, payload)`` instead, which encodes once, keeping ``bytes`` binary in
MessagePack (base64 in JSON). Problems stay ``application/problem+json`` whatever the
client accepts.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from enum import Enum
from typing import Any
from uuid import UUID

import msgpack
from fastapi import Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.routing import APIRoute
from pydantic import BaseModel

from app.problems import UnsupportedMediaType
from engine.errors import InvalidRequest

JSON = "application/json"
MSGPACK = "application/msgpack"
MSGPACK_ALIASES = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})
BODY_FORMAT_SCOPE_KEY = "quorra.body_format"
MSGPACK_DEPTH_MAX = 32


def media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def _accept_q(accept: str, wanted: frozenset[str], family: str) -> float:
    """The q-value ``accept`` gives to any of ``wanted``; wildcards count, exact wins."""
    best = -1.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        kind = fields[0].lower()
        q = 1.0
        for f in fields[1:]:
            if f.lower().startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if kind in wanted:
            best = max(best, q + 0.001)  # an exact type beats a wildcard of equal q
        elif kind in ("*/*", family):
            best = max(best, q)
    return best


def wants_msgpack(request: Request) -> bool:
    """True when ``Accept`` prefers MessagePack to JSON (JSON wins ties and silence)."""
    return prefers_msgpack(request.headers.get("accept", ""))


def prefers_msgpack(accept: str) -> bool:
    """``wants_msgpack`` of an ``Accept`` header's value."""
    if "msgpack" not in accept:
        return False
    return _accept_q(accept, MSGPACK_ALIASES, "application/*") > _accept_q(
        accept, frozenset({JSON}), "application/*"
    )


def _iso(value: datetime) -> str:
    """As pydantic writes it: UTC as ``Z``."""
    return value.isoformat().replace("+00:00", "Z")


def _msgpack_default(value: object) -> object:
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="python")
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"cannot encode {type(value).__name__} as MessagePack")


def packb(payload: object) -> bytes:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="python")
    packed: bytes = msgpack.packb(payload, use_bin_type=True, default=_msgpack_default)
    return packed


def _json_ready(payload: object) -> object:
    """JSON has no bytes: raw bytes in a payload go out base64-encoded."""
    return jsonable_encoder(
        payload,
        custom_encoder={bytes: lambda b: base64.b64encode(b).decode("ascii"), datetime: _iso},
    )


def respond(
    request: Request,
    payload: object,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Render ``payload`` (a model, dict or list) in the format the client prefers."""
    if wants_msgpack(request):
        return Response(packb(payload), status_code, dict(headers or {}), media_type=MSGPACK)
    body = json.dumps(_json_ready(payload), ensure_ascii=False, separators=(",", ":"))
    return Response(body.encode("utf-8"), status_code, dict(headers or {}), media_type=JSON)


def unpackb(raw: bytes) -> object:
    """Decode a request body; anything but one well-formed object is ``InvalidRequest``."""
    try:
        value = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True, timestamp=0)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise InvalidRequest(f"the body is not valid MessagePack: {e}") from None
    except (TypeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the body is not valid MessagePack: {e}") from None
    _check_depth(value, 0)
    return value


_CONTAINERS = frozenset({dict, list})


def _check_depth(value: object, depth: int) -> None:
    """``InvalidRequest`` when anything in ``value`` (at ``depth``) lies deeper than
    ``MSGPACK_DEPTH_MAX``. Only containers are visited: a list of a thousand receipts
    is one call, not a thousand."""
    if depth > MSGPACK_DEPTH_MAX:
        raise InvalidRequest(f"the body nests deeper than {MSGPACK_DEPTH_MAX} levels")
    if isinstance(value, dict):
        items: Iterable[object] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return
    if value and depth + 1 > MSGPACK_DEPTH_MAX:  # its items lie too deep, whatever they are
        raise InvalidRequest(f"the body nests deeper than {MSGPACK_DEPTH_MAX} levels")
    if _CONTAINERS.isdisjoint(map(type, items)):
        # MessagePack decodes to exact dicts and lists: none here, nothing to visit, found
        # without a Python step per item (the receipts of an ack frame, say).
        return
    for v in items:
        if isinstance(v, dict | list):
            _check_depth(v, depth + 1)


class NegotiatedRoute(APIRoute):
    """An API route whose body may be JSON or MessagePack."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def negotiated(request: Request) -> Response:
            kind = media_type(request.headers.get("content-type"))
            if kind in MSGPACK_ALIASES:
                request = await _as_decoded_json(request)
            elif kind and kind != JSON and not kind.endswith("+json") and self.body_field:
                raise UnsupportedMediaType(f"send {JSON} or {MSGPACK}, not {kind}")
            response = await handler(request)
            if response.media_type == JSON and wants_msgpack(request):
                return _transcoded(response)
            return response

        return negotiated


def _transcoded(response: Response) -> Response:
    """A JSON answer FastAPI serialised, re-encoded as MessagePack (JSON maps losslessly).

    Endpoints on hot paths, or with binary fields, call ``respond`` instead and skip this.
    """
    packed = msgpack.packb(json.loads(bytes(response.body)), use_bin_type=True)
    headers = {
        k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")
    }
    return Response(
        packed, response.status_code, headers, media_type=MSGPACK, background=response.background
    )


async def _as_decoded_json(request: Request) -> Request:
    raw = await request.body()
    decoded = unpackb(raw) if raw else None
    scope = dict(request.scope)
    scope[BODY_FORMAT_SCOPE_KEY] = "msgpack"
    scope["headers"] = [
        (k, JSON.encode("latin-1") if k == b"content-type" else v) for k, v in scope["headers"]
    ]
    replaced = Request(scope, request.receive)
    # FastAPI parses JSON bodies with `await request.json()`; Starlette caches both.
    replaced._body = raw
    if raw:
        replaced._json = decoded
    return replaced


def openapi_msgpack(model: type[BaseModel] | None = None) -> dict[str, object]:
    """``openapi_extra`` for a route whose request body may also be MessagePack."""
    schema: dict[str, object] = (
        {"$ref": f"#/components/schemas/{model.__name__}"} if model is not None else {}
    )
    return {"requestBody": {"content": {MSGPACK: {"schema": schema}}}}


MSGPACK_RESPONSE: dict[str, object] = {"content": {MSGPACK: {}}}
"""Add to ``responses={200: MSGPACK_RESPONSE}`` for routes that use ``respond``."""
