"""``BodyLimitMiddleware`` (app/main.py) on its own: what it reads and what it refuses."""

from __future__ import annotations

import asyncio

from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from app.main import BodyLimitMiddleware

LIMIT_BYTES = 100


def _scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "method": "POST", "path": "/", "headers": list(headers)}


def _run(scope: Scope, chunks: list[bytes]) -> tuple[list[Message], bytes | Exception]:
    """The app's answer and what the app behind the limit read (or what stopped it)."""
    pending = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Message] = []
    read: list[bytes | Exception] = []

    async def receive() -> Message:
        return pending.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        try:
            while True:
                message = await receive()
                body += message["body"]
                if not message["more_body"]:
                    break
        except HTTPException as e:
            read.append(e)
            return
        read.append(body)

    asyncio.run(BodyLimitMiddleware(inner, LIMIT_BYTES)(scope, receive, send))
    return sent, read[0] if read else b""


def test_a_declared_length_within_the_limit_is_read_as_it_is() -> None:
    sent, read = _run(_scope((b"content-length", b"60")), [b"x" * 30, b"y" * 30])
    assert sent == [] and read == b"x" * 30 + b"y" * 30


def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    sent, read = _run(_scope((b"content-length", b"101")), [b"x" * 101])
    assert sent[0]["status"] == 413 and read == b""


def test_a_chunked_body_is_counted_even_with_a_small_declared_length() -> None:
    """A request naming a ``Transfer-Encoding`` and a ``Content-Length`` may be framed
    by the former: its body is counted as it arrives."""
    scope = _scope((b"content-length", b"10"), (b"transfer-encoding", b"chunked"))
    _, read = _run(scope, [b"x" * 60, b"y" * 60])
    assert isinstance(read, HTTPException) and read.status_code == 413


def test_a_body_without_a_declared_length_is_counted() -> None:
    _, read = _run(_scope(), [b"x" * 60, b"y" * 60])
    assert isinstance(read, HTTPException) and read.status_code == 413
    _, read = _run(_scope(), [b"x" * 60, b"y" * 40])
    assert read == b"x" * 60 + b"y" * 40
