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
its access log, the errors it raises. The body and everything else are uvicorn's code.
"""

from __future__ import annotations

from typing import ClassVar

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string


class CheckedHeadersCycle(RequestResponseCycle):
    """See the module. ``CoalescingProtocol`` makes its cycles of this class."""

    LINES_MAX: ClassVar[int] = 1024
    _checked: ClassVar[dict[tuple[bytes, bytes], bytes]] = {}
    """Header lines found valid, as sent -> the name lowered. What a line is does not
    depend on the app or the connection, so every cycle of the process shares them."""

    async def send(self, message: ASGISendEvent) -> None:
        if (
            self.response_started
            or message["type"] != "http.response.start"
            or self.disconnected
            or self.flow.write_paused
        ):
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
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        checked = self._checked
        for line in (*self.default_headers, *message.get("headers", ())):
            if type(line) is not tuple:  # ASGI allows any pair, e.g. a list
                line = (line[0], line[1])
            name = checked.get(line)
            value = line[1]
            if name is None:
                name = self._check(line)
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

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
