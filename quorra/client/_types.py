"""The values a client sends and gets back, and its one error type.

Rule: plain frozen values and pure functions (no I/O); the REST and stream clients
share them, so a message looks the same whichever way it travels.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Message:
    """One message to publish; a plain ``bytes`` or ``str`` is a message with only a
    body (text is sent as UTF-8)."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    ttl_ms: int | None = None
    delay_ms: int = 0
    dedup_id: str | None = None


Publishable = Message | bytes | str


@dataclass(frozen=True, slots=True)
class Delivery:
    """A received message, leased until ``lease_expires_at_ms`` (epoch ms) unless
    acked, nacked or extended by its ``receipt``."""

    id: int
    receipt: str
    body: bytes
    headers: dict[str, str]
    priority: int
    delivery_count: int
    published_at_ms: int
    lease_expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Settled:
    """What an ack, nack or extend did: ``stale`` are the receipts whose lease ended."""

    settled: int
    stale: list[str]


class Problem(Exception):
    """An RFC 9457 problem from the server (HTTP or a stream's error frame)."""

    def __init__(
        self,
        status: int,
        type_: str,
        title: str,
        detail: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{title} ({status}){': ' + detail if detail else ''}")
        self.status, self.type, self.title, self.detail = status, type_, title, detail
        self.extra = extra or {}

    @classmethod
    def of(cls, body: object, status: int) -> Problem:
        """The problem in a decoded answer (or a stand-in when it is none)."""
        if isinstance(body, dict) and "title" in body:
            extra = {k: v for k, v in body.items() if k not in ("status", "type", "title")}
            return cls(
                int(body.get("status", status)),
                str(body.get("type", "about:blank")),
                str(body["title"]),
                str(body.get("detail") or ""),
                extra,
            )
        return cls(status, "about:blank", f"HTTP {status}")


def message_map(m: Publishable) -> dict[str, object]:
    """A message as the API's MessagePack bodies and frames carry it (defaults left out)."""
    if isinstance(m, bytes):
        return {"body": m}
    if isinstance(m, str):
        return {"body": m.encode("utf-8")}
    out: dict[str, object] = {"body": m.body}
    if m.headers:
        out["headers"] = m.headers
    if m.priority:
        out["priority"] = m.priority
    if m.ttl_ms is not None:
        out["ttl_ms"] = m.ttl_ms
    if m.delay_ms:
        out["delay_ms"] = m.delay_ms
    if m.dedup_id is not None:
        out["dedup_id"] = m.dedup_id
    return out


_DELIVERY_SETTERS = tuple(getattr(Delivery, f.name).__set__ for f in fields(Delivery))
"""Each field's slot setter, in the fields' order."""


def deliveries_of(items: list[dict[str, Any]]) -> list[Delivery]:
    """The delivered messages of a stream's ``deliver`` frame, as ``Delivery(...)`` would
    build them. A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; each field's slot set directly costs about a third of that,
    and a stream consumer builds one per message."""
    new = object.__new__
    s_id, s_receipt, s_body, s_headers, s_priority, s_count, s_published, s_lease = (
        _DELIVERY_SETTERS
    )
    out = []
    for item in items:
        d = new(Delivery)
        s_id(d, item["id"])
        s_receipt(d, item["receipt"])
        s_body(d, item["body"])
        s_headers(d, item.get("headers") or {})
        s_priority(d, item.get("priority", 0))
        s_count(d, item["delivery_count"])
        s_published(d, item["published_at_ms"])
        s_lease(d, item["lease_expires_at_ms"])
        out.append(d)
    return out


def received_of(item: dict[str, Any]) -> Delivery:
    """A message of a REST receive answer in MessagePack (times as ISO 8601 text)."""
    return Delivery(
        id=item["id"],
        receipt=item["receipt"],
        body=item["body"],
        headers=item.get("headers") or {},
        priority=item.get("priority", 0),
        delivery_count=item["delivery_count"],
        published_at_ms=_epoch_ms(item.get("published_at")),
        lease_expires_at_ms=_epoch_ms(item.get("lease_expires_at")),
    )


def _epoch_ms(text: object) -> int:
    from datetime import datetime

    if not isinstance(text, str):
        return 0
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
