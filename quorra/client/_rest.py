"""The REST message endpoints (API.md), blocking (``Client``) and asyncio
(``AsyncClient``), in MessagePack both ways.

Rule: one request per call. A 429 or 503 answer is waited out as its ``Retry-After``
says and the request sent again, up to ``retries`` times (a 503 ``outcome-unknown``
publish may have happened: give messages a ``dedup_id`` to make that retry safe); any
other problem is raised as ``Problem``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx
import msgpack

from quorra.client._stream import AsyncStream, Stream
from quorra.client._types import Delivery, Problem, Publishable, Settled, message_map, received_of

MSGPACK = "application/msgpack"
RETRY_STATUSES = frozenset({429, 503})
RETRIES_DEFAULT = 30
RETRY_AFTER_S_MAX = 30.0
TIMEOUT_S = 60.0


def _headers(token: str) -> dict[str, str]:
    if not token:
        raise ValueError("a token is needed: POST /api/v1/tokens (or quorra token create)")
    return {
        "Authorization": f"Bearer {token}",
        "Accept": MSGPACK,
        "Content-Type": MSGPACK,
        "User-Agent": "quorra-client",
    }


def _retry_after_s(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", "1")), RETRY_AFTER_S_MAX)
    except ValueError:
        return 1.0


def _decoded(response: httpx.Response) -> Any:
    if not response.content:
        return {}
    if response.headers.get("content-type", "").startswith(MSGPACK):
        return msgpack.unpackb(response.content, raw=False)
    return response.json()


def _result(response: httpx.Response) -> Any:
    body = _decoded(response)
    if response.is_error:
        raise Problem.of(body, response.status_code)
    return body


def _answer(response: httpx.Response) -> dict[str, Any]:
    body = _decoded(response)
    if response.is_error:
        raise Problem.of(body, response.status_code)
    if not isinstance(body, dict):
        raise Problem(502, "about:blank", "Unexpected answer", str(response.request.url))
    return body


def _settled(response: httpx.Response) -> Settled:
    """A settle's answer; a 409 (every receipt stale) is an answer too, not a problem."""
    if response.status_code == 409:
        body = _decoded(response)
        if isinstance(body, dict) and "stale" in body:
            return Settled(0, list(body["stale"]))
    body = _answer(response)
    return Settled(int(body["settled"]), list(body["stale"]))


def _query(params: Mapping[str, object]) -> dict[str, str]:
    """Query parameters as text (booleans as ``true``/``false``); None leaves one out."""
    return {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in params.items()
        if v is not None
    }


def _messages_path(queue: str, action: str = "") -> str:
    return f"/api/v1/queues/{queue}/messages{action}"


def _settle_body(how: str, receipts: list[str], requeue: bool, lease_ms: int) -> dict[str, Any]:
    body: dict[str, Any] = {"receipts": receipts}
    if how == "nack":
        body["requeue"] = requeue
    elif how == "extend":
        body["lease_ms"] = lease_ms
    return body


def _receive_body(max_messages: int, wait_ms: int, lease_ms: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_messages": max_messages, "wait_ms": wait_ms}
    if lease_ms is not None:
        body["lease_ms"] = lease_ms
    return body


class Client:
    """A blocking client of one server. ``stream(queue)`` opens a ``Stream`` there."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retries: int = RETRIES_DEFAULT,
        timeout_s: float = TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url, self.token, self.retries = base_url.rstrip("/"), token, retries
        self.http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(token),
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )
        self.sleep = time.sleep

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, body: Mapping[str, object]) -> httpx.Response:
        """POST ``body`` in MessagePack, retried on 429/503; the last answer."""
        return self.send("POST", path, body)

    def send(
        self, method: str, path: str, body: Mapping[str, object] | None = None, **params: object
    ) -> httpx.Response:
        """One call (``body`` in MessagePack, ``params`` the query, None left out),
        retried on 429/503; the last answer."""
        content = None if body is None else msgpack.packb(dict(body), use_bin_type=True)
        query = _query(params)
        for _ in range(self.retries):
            response = self.http.request(method, path, content=content, params=query)
            if response.status_code not in RETRY_STATUSES:
                return response
            self.sleep(_retry_after_s(response))
        return self.http.request(method, path, content=content, params=query)

    def call(
        self, method: str, path: str, body: Mapping[str, object] | None = None, **params: object
    ) -> Any:
        """Any other endpoint (``path`` under ``/api/v1``: queues, stats, browse,
        snapshots...); its decoded answer (a map or a list), ``Problem`` when it is one."""
        return _result(self.send(method, f"/api/v1{path}", body, **params))

    def publish(self, queue: str, messages: Sequence[Publishable]) -> list[int]:
        """Publish a batch, all or nothing; the ids, once durable on a quorum."""
        body = {"messages": [message_map(m) for m in messages]}
        ids: list[int] = _answer(self.post(_messages_path(queue), body))["ids"]
        return ids

    def receive(
        self, queue: str, *, max_messages: int = 1, wait_ms: int = 0, lease_ms: int | None = None
    ) -> list[Delivery]:
        body = _receive_body(max_messages, wait_ms, lease_ms)
        answer = _answer(self.post(_messages_path(queue, "/receive"), body))
        return [received_of(m) for m in answer["messages"]]

    def settle(
        self, queue: str, how: str, receipts: list[str], *, requeue: bool = True, lease_ms: int = 0
    ) -> Settled:
        """``how``: ack, nack (``requeue``) or extend (to ``lease_ms``)."""
        body = _settle_body(how, receipts, requeue, lease_ms)
        return _settled(self.post(_messages_path(queue, f"/{how}"), body))

    def ack(self, queue: str, receipts: list[str]) -> Settled:
        return self.settle(queue, "ack", receipts)

    def nack(self, queue: str, receipts: list[str], *, requeue: bool = True) -> Settled:
        return self.settle(queue, "nack", receipts, requeue=requeue)

    def extend(self, queue: str, receipts: list[str], lease_ms: int) -> Settled:
        return self.settle(queue, "extend", receipts, lease_ms=lease_ms)

    def stream(self, queue: str, *, window_messages: int | None = None) -> Stream:
        return Stream(self.base_url, self.token, queue, window_messages=window_messages)


class AsyncClient:
    """The asyncio client; ``await stream(queue)`` opens an ``AsyncStream``."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        retries: int = RETRIES_DEFAULT,
        timeout_s: float = TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url, self.token, self.retries = base_url.rstrip("/"), token, retries
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(token),
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def post(self, path: str, body: Mapping[str, object]) -> httpx.Response:
        return await self.send("POST", path, body)

    async def send(
        self, method: str, path: str, body: Mapping[str, object] | None = None, **params: object
    ) -> httpx.Response:
        """As ``Client.send``."""
        content = None if body is None else msgpack.packb(dict(body), use_bin_type=True)
        query = _query(params)
        for _ in range(self.retries):
            response = await self.http.request(method, path, content=content, params=query)
            if response.status_code not in RETRY_STATUSES:
                return response
            await asyncio.sleep(_retry_after_s(response))
        return await self.http.request(method, path, content=content, params=query)

    async def call(
        self, method: str, path: str, body: Mapping[str, object] | None = None, **params: object
    ) -> Any:
        """As ``Client.call``."""
        return _result(await self.send(method, f"/api/v1{path}", body, **params))

    async def publish(self, queue: str, messages: Sequence[Publishable]) -> list[int]:
        body = {"messages": [message_map(m) for m in messages]}
        ids: list[int] = _answer(await self.post(_messages_path(queue), body))["ids"]
        return ids

    async def receive(
        self, queue: str, *, max_messages: int = 1, wait_ms: int = 0, lease_ms: int | None = None
    ) -> list[Delivery]:
        body = _receive_body(max_messages, wait_ms, lease_ms)
        answer = _answer(await self.post(_messages_path(queue, "/receive"), body))
        return [received_of(m) for m in answer["messages"]]

    async def settle(
        self, queue: str, how: str, receipts: list[str], *, requeue: bool = True, lease_ms: int = 0
    ) -> Settled:
        body = _settle_body(how, receipts, requeue, lease_ms)
        return _settled(await self.post(_messages_path(queue, f"/{how}"), body))

    async def ack(self, queue: str, receipts: list[str]) -> Settled:
        return await self.settle(queue, "ack", receipts)

    async def nack(self, queue: str, receipts: list[str], *, requeue: bool = True) -> Settled:
        return await self.settle(queue, "nack", receipts, requeue=requeue)

    async def extend(self, queue: str, receipts: list[str], lease_ms: int) -> Settled:
        return await self.settle(queue, "extend", receipts, lease_ms=lease_ms)

    async def stream(self, queue: str, *, window_messages: int | None = None) -> AsyncStream:
        return await AsyncStream.open(
            self.base_url, self.token, queue, window_messages=window_messages
        )
