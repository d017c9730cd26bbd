"""``CheckedHeadersCycle`` writes the heads uvicorn's cycle writes, byte for byte and
with the same framing, whether a head is made or found among those made before."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from app.http_cycle import CheckedHeadersCycle


class Kept:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> Any:
        return None


def _cycle(kind: type[RequestResponseCycle], method: str, keep_alive: bool) -> Any:
    import logging

    transport = Kept()
    cycle = kind(
        scope={"method": method, "type": "http"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[(b"date", b"Sun, 29 Nov 2026 06:00:00 GMT")],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    return cycle, transport


NAMES = [b"Content-Length", b"content-type", b"Connection", b"Transfer-Encoding", b"X-A"]
VALUES = [b"0", b"12", b"close", b"keep-alive, Close", b"chunked", b"text/plain"]


@settings(max_examples=300, deadline=None)
@given(
    status=st.sampled_from([200, 201, 204, 304, 409]),
    method=st.sampled_from(["POST", "HEAD", "GET"]),
    keep_alive=st.booleans(),
    lines=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES)), max_size=5),
    as_lists=st.booleans(),
)
def test_heads_are_uvicorns_made_or_kept(
    status: int, method: str, keep_alive: bool, lines: list[tuple[bytes, bytes]], as_lists: bool
) -> None:
    headers: list[Any] = [list(line) for line in lines] if as_lists else list(lines)
    message = {"type": "http.response.start", "status": status, "headers": headers}

    async def outcome(kind: type[RequestResponseCycle]) -> tuple[object, ...]:
        cycle, out = _cycle(kind, method, keep_alive)
        try:
            await cycle.send(dict(message))
        except (ValueError, RuntimeError) as e:
            return ("raised", type(e))
        framing = (cycle.expected_content_length, cycle.chunked_encoding, cycle.keep_alive)
        return ("wrote", out.written, framing)

    async def go() -> None:
        expected = await outcome(RequestResponseCycle)
        for _ in range(2):  # made, then kept
            assert await outcome(CheckedHeadersCycle) == expected

    asyncio.run(go())
