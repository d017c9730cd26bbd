"""A lean HTTP/1.1 client for benches that time many small requests: one keep-alive
connection, requests written as bytes, answers read by their ``Content-Length``.

Rule: it exists so that a bench times the server, not its client. ``httpx.AsyncClient``
spends about 4 ms of CPU per small request here, several times what the server spends
answering it (a receive of one message), and the bench's client shares the machine's
cores with the server: a round of 10,000 requests through it measured mostly httpx.
This client sends one request at a time per connection and knows only what the
Quorra server answers: a status line, headers with ``Content-Length`` (an answer
without one is refused with ``ValueError``), a body; ``Connection: close`` closes it.
A broken connection raises ``OSError`` (or ``asyncio.IncompleteReadError``, one); the
next request opens a new one.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

HEAD_BYTES_MAX = 64 * 1024
"""Bytes of a status line and headers, at most (``StreamReader.readuntil``'s limit)."""


class LeanHttp:
    """Requests to ``url`` (``http://host:port``) with a bearer ``token``."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.hostname and parts.port, url
        self.host, self.port = parts.hostname, parts.port
        self._fixed = (
            f"Host: {self.host}:{self.port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
        )
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path``; the status and the body of the answer."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, limit=HEAD_BYTES_MAX
            )
        assert self._reader is not None
        head = f"POST {path} HTTP/1.1\r\n{self._fixed}Content-Length: {len(body)}\r\n\r\n"
        self._writer.write(head.encode("ascii") + body)
        try:
            status, length, close = _parse_head(await self._reader.readuntil(b"\r\n\r\n"))
            answer = await self._reader.readexactly(length)
        except BaseException:
            self.close()
            raise
        if close:
            self.close()
        return status, answer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def _parse_head(head: bytes) -> tuple[int, int, bool]:
    """The status, the body's length and whether the server closes the connection."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length: int | None = None
    close = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    if length is None:
        raise ValueError(f"an answer without Content-Length: {head[:200]!r}")
    return status, length, close


__all__ = ["LeanHttp"]
