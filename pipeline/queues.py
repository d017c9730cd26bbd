"""What the pipeline asks a server besides moving messages, through ``quorra.client``'s
``Client``: queue definitions and stats, browse pages, snapshot and compaction history.

Rule: thin functions over ``Client.call`` (MessagePack, 429/503 retried, problems raised
as ``quorra.client.Problem``); messages come back as ``quorra.client.Delivery``, the
same type a stream delivers, so Spark rows are built one way. A browsed message has no
lease: its ``receipt`` is empty and ``lease_expires_at_ms`` 0.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from quorra.client import Client, Delivery


def connect(url: str, token: str) -> Client:
    """A blocking client of the server at ``url`` (cheap: one keep-alive pool)."""
    return Client(url, token)


def to_ms(value: object) -> int:
    """Milliseconds since the epoch from an int/float (ms) or an ISO 8601 string."""
    if value is None:
        return 0
    if isinstance(value, int | float):
        return int(value)
    text = str(value).replace("Z", "+00:00")
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def create_queue(client: Client, queue: str, **args: object) -> dict[str, Any]:
    return dict(client.call("PUT", f"/queues/{queue}", args))


def queue_info(client: Client, queue: str) -> dict[str, Any]:
    """The queue's definition and ``stats``."""
    return dict(client.call("GET", f"/queues/{queue}"))


def queue_names(client: Client) -> list[str]:
    answer = client.call("GET", "/queues")
    items = answer.get("queues", []) if isinstance(answer, dict) else answer
    return [str(q["name"]) for q in items]


def pending(client: Client, queue: str) -> int:
    """Messages ready or leased: 0 once everything was consumed and settled."""
    stats = queue_info(client, queue).get("stats", {})
    return int(stats.get("messages_ready", 0)) + int(stats.get("messages_unacked", 0))


def history(client: Client, queue: str, what: str) -> list[dict[str, Any]]:
    """``snapshots`` or ``compactions`` of ``queue``, oldest first."""
    answer = client.call("GET", f"/queues/{queue}/{what}")
    if isinstance(answer, list):
        return answer
    for key in (what, "items", "history", "records"):
        if isinstance(answer.get(key), list):
            return list(answer[key])
    return []


def browse(client: Client, queue: str, after: int | None, limit: int) -> list[tuple[int, Delivery]]:
    """Up to ``limit`` ready messages after cursor ``after`` (None: from the head), each
    with its cursor; nothing is consumed."""
    answer = client.call("GET", f"/queues/{queue}/messages", after=after, limit=limit)
    return [(int(m["cursor"]), browsed(m)) for m in answer["messages"]]


def browsed(item: dict[str, Any]) -> Delivery:
    return Delivery(
        id=int(item["id"]),
        receipt="",
        body=bytes(item["body"]),
        headers={str(k): str(v) for k, v in (item.get("headers") or {}).items()},
        priority=int(item.get("priority") or 0),
        delivery_count=int(item.get("delivery_count") or 0),
        published_at_ms=to_ms(item.get("published_at_ms", item.get("published_at"))),
        lease_expires_at_ms=0,
    )
