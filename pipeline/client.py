"""A small synchronous REST client of one Quorra server, used on the Spark driver and
executors (API.md). Message endpoints speak MessagePack (raw ``bytes`` bodies, no base64);
429 and 503 are retried as ``Retry-After`` says; any other problem raises ``QuorraError``
with its problem ``type`` and HTTP status.

The client holds one ``httpx.Client`` (keep-alive) and is cheap to make: executors build
one per task from the options, never pickling a live connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import msgpack

MSGPACK = "application/msgpack"
RETRY_STATUSES = frozenset({429, 503})
RETRIES_MAX = 60
RETRY_AFTER_S_MAX = 10.0
TIMEOUT_S = 60.0


class QuorraError(Exception):
    """A problem answer (RFC 9457) the client does not retry."""

    def __init__(self, status: int, type_: str, detail: str) -> None:
        super().__init__(f"HTTP {status} {type_}: {detail}")
        self.status = status
        self.type = type_
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Message:
    """A received (``receipt`` set) or browsed (``cursor`` set) message."""

    id: int
    body: bytes
    headers: dict[str, str]
    priority: int
    delivery_count: int
    published_at_ms: int
    receipt: str | None = None
    cursor: int | None = None


def to_ms(value: object) -> int:
    """Milliseconds since the epoch from an int/float (ms) or an ISO 8601 string."""
    if value is None:
        return 0
    if isinstance(value, int | float):
        return int(value)
    text = str(value).replace("Z", "+00:00")
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def _message(raw: Mapping[str, Any]) -> Message:
    body = raw.get("body", b"")
    if isinstance(body, str):
        if raw.get("encoding") == "base64":
            import base64

            body = base64.b64decode(body)
        else:
            body = body.encode("utf-8")
    published = raw.get("published_at_ms", raw.get("published_at"))
    return Message(
        id=int(raw["id"]),
        body=bytes(body),
        headers={str(k): str(v) for k, v in (raw.get("headers") or {}).items()},
        priority=int(raw.get("priority") or 0),
        delivery_count=int(raw.get("delivery_count") or 0),
        published_at_ms=to_ms(published),
        receipt=raw.get("receipt"),
        cursor=int(raw["cursor"]) if raw.get("cursor") is not None else None,
    )


class QuorraClient:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": MSGPACK},
            timeout=httpx.Timeout(timeout_s),
        )
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> QuorraClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: object = None, **params: int | str | None
    ) -> Any:
        """One call with retries on 429/503; the decoded answer (None when empty), as
        msgpack or httpx decode it: ``Any``, which the callers below take apart."""
        content = None if body is None else msgpack.packb(body, use_bin_type=True)
        headers = {} if body is None else {"Content-Type": MSGPACK}
        query = {k: v for k, v in params.items() if v is not None}
        for _ in range(RETRIES_MAX):
            response = self._http.request(
                method, f"/api/v1{path}", content=content, headers=headers, params=query
            )
            if response.status_code in RETRY_STATUSES:
                self._sleep(_retry_after_s(response))
                continue
            if response.is_error:
                raise _problem(response)
            return _decode(response)
        raise QuorraError(503, "retries-exhausted", f"{method} {path}: gave up after retries")

    # --- queues ---------------------------------------------------------------------

    def create_queue(self, queue: str, **args: object) -> Any:
        return self.request("PUT", f"/queues/{queue}", args)

    def delete_queue(self, queue: str) -> None:
        self.request("DELETE", f"/queues/{queue}")

    def queue(self, queue: str) -> dict[str, Any]:
        """Definition and ``stats``."""
        return dict(self.request("GET", f"/queues/{queue}"))

    def queues(self) -> list[dict[str, Any]]:
        answer = self.request("GET", "/queues")
        return list(answer.get("queues", answer) if isinstance(answer, dict) else answer)

    def snapshots(self, queue: str) -> list[dict[str, Any]]:
        return _items(self.request("GET", f"/queues/{queue}/snapshots"), "snapshots")

    def compactions(self, queue: str) -> list[dict[str, Any]]:
        return _items(self.request("GET", f"/queues/{queue}/compactions"), "compactions")

    # --- messages -------------------------------------------------------------------

    def publish(self, queue: str, messages: Sequence[Mapping[str, object]]) -> list[int]:
        """Publish one batch (all or nothing); the ids once durable on a quorum."""
        answer = self.request("POST", f"/queues/{queue}/messages", {"messages": list(messages)})
        ids = [int(i) for i in answer["ids"]]
        if len(ids) != len(messages):
            raise QuorraError(500, "short-confirm", f"{len(ids)} ids for {len(messages)}")
        return ids

    def receive(
        self, queue: str, max_messages: int, wait_ms: int = 0, lease_ms: int | None = None
    ) -> list[Message]:
        body: dict[str, object] = {"max_messages": max_messages, "wait_ms": wait_ms}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        answer = self.request("POST", f"/queues/{queue}/messages/receive", body)
        return [_message(m) for m in _items(answer, "messages")]

    def ack(self, queue: str, receipts: Sequence[str]) -> list[int]:
        """Settle; returns the positions of stale receipts (lease expired meanwhile)."""
        return self._settle("ack", queue, list(receipts))

    def nack(self, queue: str, receipts: Sequence[str], requeue: bool = True) -> list[int]:
        return self._settle("nack", queue, list(receipts), requeue=requeue)

    def extend(self, queue: str, receipts: Sequence[str], lease_ms: int) -> list[int]:
        return self._settle("extend", queue, list(receipts), lease_ms=lease_ms)

    def browse(self, queue: str, after: int | None, limit: int) -> list[Message]:
        answer = self.request("GET", f"/queues/{queue}/messages", after=after, limit=limit)
        return [_message(m) for m in _items(answer, "messages")]

    def _settle(self, verb: str, queue: str, receipts: list[str], **extra: object) -> list[int]:
        if not receipts:
            return []
        body = {"receipts": receipts, **extra}
        try:
            answer = self.request("POST", f"/queues/{queue}/messages/{verb}", body)
        except QuorraError as e:
            # A batch whose receipts are all stale may be answered 409 as a whole.
            if e.status == 409:
                return list(range(len(receipts)))
            raise
        return _stale_positions(answer, receipts)


def _stale_positions(answer: object, receipts: Sequence[str]) -> list[int]:
    if not isinstance(answer, dict):
        return []
    stale = answer.get("stale") or []
    positions: list[int] = []
    index = {r: i for i, r in enumerate(receipts)}
    for item in stale:
        if isinstance(item, int):
            positions.append(item)
        elif isinstance(item, str) and item in index:
            positions.append(index[item])
        elif isinstance(item, dict):
            if "position" in item:
                positions.append(int(item["position"]))
            elif item.get("receipt") in index:
                positions.append(index[item["receipt"]])
    return positions


def _items(answer: object, key: str) -> list[dict[str, Any]]:
    if isinstance(answer, list):
        return answer
    if isinstance(answer, dict):
        for name in (key, "items", "history", "records"):
            if isinstance(answer.get(name), list):
                return list(answer[name])
    return []


def _decode(response: httpx.Response) -> Any:
    if not response.content:
        return None
    if response.headers.get("content-type", "").startswith(MSGPACK):
        return msgpack.unpackb(response.content, raw=False, strict_map_key=False)
    return response.json()


def _retry_after_s(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", "0.2")), RETRY_AFTER_S_MAX)
    except ValueError:
        return 0.2


def _problem(response: httpx.Response) -> QuorraError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return QuorraError(
        response.status_code,
        str(body.get("type", "about:blank")),
        str(body.get("detail") or body.get("title") or response.reason_phrase),
    )
