"""``CheckedHeadersCycle``: uvicorn's request-response cycle (httptools), whose response
head is written without checking again the header lines it checked before.

uvicorn checks every header line of every response against two regular expressions and
lowers its name, then writes it: about ten lines on a message answer (its own date and
server, the length and type, the four security headers, ``Quorra-Leader``), nearly all
the very lines of the answer before, and the cycle's ``send`` was the largest of the
protocol's costs on a single publish. Here a line checked once is remembered as a good
one with its name lowered (up to ``LINES_MAX`` of them, then forgotten together: the
date line changes every second, the lengths vary); every other step of the head is
uvicorn's own (0.54): the status line, the length or chunked framing, ``Connection``,
its access log, the errors it raises. The body's reading is uvicorn's code but for one
wait skipped (``receive``); its writing is uvicorn's but for a whole body (below).

A whole head made once is kept too, by all it is made of (``HEADS_MAX`` of them, then
forgotten together): a busy endpoint's answers repeat one head, and the walk over its
lines, checked or not, was still the largest part of writing it.

The rest of a small answer is cut the same way, each step uvicorn's own: a whole body of
the declared length is sent by a plain call (``_sent_whole``), a head is held for the
response's end when the transport gathers writes (``CoalescingTransport.hold``, no
callback scheduled to flush it), the request's event is a ``RequestEvent`` and the task
takes itself out of the server's tasks as it ends (``run_asgi``): each was a coroutine,
a callback of the loop or a few Python steps more on every request.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar, NamedTuple

from uvicorn._types import ASGI3Application, ASGIReceiveEvent, ASGISendEvent, HTTPRequestEvent
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string


def _nothing() -> None:
    """A cycle's ``on_response`` once its app has returned."""


class RequestEvent:
    """What a cycle uses of an ``asyncio.Event`` (``set``, ``clear``, ``is_set``,
    ``wait``), with the same behaviour: one is made per request, and it is set two or
    three times in each, where ``asyncio.Event``'s making and its ``set`` were Python
    steps more (a deque made, the loop check of its mixin, a walk over no waiters)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            if self._waiters:
                for waiter in self._waiters:
                    if not waiter.done():
                        waiter.set_result(True)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)


class Head(NamedTuple):
    """A response head as written, and what it tells the cycle about the body."""

    data: bytes
    expected_content_length: int
    chunked_encoding: bool | None
    keep_alive: bool


class CheckedHeadersCycle(RequestResponseCycle):
    """See the module. ``CoalescingProtocol`` makes its cycles of this class."""

    LINES_MAX: ClassVar[int] = 1024
    _checked: ClassVar[dict[tuple[bytes, bytes], bytes]] = {}
    """Header lines found valid, as sent -> the name lowered. What a line is does not
    depend on the app or the connection, so every cycle of the process shares them."""
    HEADS_MAX: ClassVar[int] = 1024
    _heads: ClassVar[dict[tuple[object, ...], Head]] = {}
    """Whole heads, by everything they are made of (status, keep-alive, ``HEAD`` or not,
    every line): the answers of a busy endpoint are the same head again and again
    (until the date line's second changes), and its lines need not be walked again."""

    task: asyncio.Task[None] | None = None
    """The task running ``run_asgi``, when the protocol that made it keeps its tasks in
    ``tasks`` (``CoalescingProtocol._start_asgi_task``)."""
    tasks: set[asyncio.Task[None]] | None = None

    async def run_asgi(self, app: ASGI3Application) -> None:
        """uvicorn's (0.54), which then takes its task out of the protocol's ``tasks``
        itself (see ``task``): uvicorn scheduled a done callback per request for that."""
        try:
            result = await app(self.scope, self.receive, self.send)  # type: ignore[func-returns-value]
        except BaseException as exc:
            self.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if result is not None:
                msg = "ASGI callable should return None, but returned '%s'."
                self.logger.error(msg, result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                self.logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                self.logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing
            if self.tasks is not None:
                self.tasks.discard(self.task)

    async def send(self, message: ASGISendEvent) -> None:
        if (
            self.response_started
            or message["type"] != "http.response.start"
            or self.disconnected
            or self.flow.write_paused
        ):
            if not self._sent_whole(message):
                await super().send(message)
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        key = (
            status_code,
            self.keep_alive,
            self.scope["method"] == "HEAD",
            *self.default_headers,
            *message.get("headers", ()),
        )
        heads = self._heads
        try:
            head = heads.get(key)
        except TypeError:  # a line that is not a tuple (ASGI allows any pair): not kept
            head = self._head(status_code, key[2], key[3:])
        else:
            if head is None:
                head = self._head(status_code, key[2], key[3:])
                if len(heads) >= self.HEADS_MAX:
                    heads.clear()
                heads[key] = head
        if self.chunked_encoding is None:
            self.expected_content_length = head.expected_content_length
            self.chunked_encoding = head.chunked_encoding
        self.keep_alive = head.keep_alive
        # A transport that gathers writes (``CoalescingTransport.hold``) keeps the head
        # for the response's end, which sends it with the body that follows.
        hold = getattr(self.transport, "hold", None)
        if hold is not None:
            hold(head.data)
        else:
            self.transport.write(head.data)

    def _sent_whole(self, message: ASGISendEvent) -> bool:
        """Send ``message`` if it is the whole body of a response framed by its
        ``Content-Length``, as uvicorn's ``send`` would (the answer of nearly every
        request), and say whether it did; else leave it to uvicorn. A plain call, where
        uvicorn's ``send`` was a coroutine more per request and walked every case."""
        if (
            message["type"] != "http.response.body"
            or not self.response_started
            or self.response_complete
            or self.disconnected
            or self.flow.write_paused
            or self.chunked_encoding is not False
            or message.get("more_body", False)
            or self.scope["method"] == "HEAD"
        ):
            return False
        body = message.get("body", b"")
        if len(body) != self.expected_content_length:
            return False  # uvicorn's error
        self.expected_content_length = 0
        # The response ends below, and its end sends what is gathered (``hold``).
        hold = getattr(self.transport, "hold", None)
        if hold is not None:
            hold(body)
        else:
            self.transport.write(body)
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True

    async def receive(self) -> ASGIReceiveEvent:
        """uvicorn's, without waiting on the request's event when it is set already: a
        small request's body has arrived, whole, before its task first runs, and the
        wait was a coroutine made and run for nothing on every request."""
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            event = self.message_event
            if not event.is_set():
                await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message: HTTPRequestEvent = {
            "type": "http.request",
            "body": bytes(self.body),
            "more_body": self.more_body,
        }
        self.body = bytearray()
        return message

    def _head(self, status_code: int, is_head: object, lines: tuple[object, ...]) -> Head:
        """uvicorn's head for these lines, as it writes it (status line, lines checked,
        the framing and ``Connection`` it adds) and what it learns from them."""
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        checked = self._checked
        keep_alive = self.keep_alive
        expected_content_length, chunked_encoding = 0, None
        for line in lines:
            if type(line) is not tuple:  # ASGI allows any pair, e.g. a list
                line = (line[0], line[1])  # type: ignore[index]
            name = checked.get(line)
            value = line[1]
            if name is None:
                name = self._check(line)
            if name == b"content-length" and chunked_encoding is None:
                expected_content_length = int(value.decode())
                chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                expected_content_length = 0
                chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if chunked_encoding is None and not is_head and status_code not in (204, 304):
            chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return Head(b"".join(content), expected_content_length, chunked_encoding, keep_alive)

    def _check(self, line: tuple[bytes, bytes]) -> bytes:
        """uvicorn's checks of a header line; its name lowered, remembered if valid."""
        name, value = line
        if HEADER_RE.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
        checked = self._checked
        if len(checked) >= self.LINES_MAX:
            checked.clear()
        lowered = checked[line] = name.lower()
        return lowered
