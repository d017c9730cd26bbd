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


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["POST", "HEAD", "GET"]),
    keep_alive=st.booleans(),
    declared=st.sampled_from([None, 0, 3, 5]),
    chunks=st.lists(st.binary(max_size=6), min_size=1, max_size=3),
    last_more=st.booleans(),
)
def test_bodies_are_sent_as_uvicorn_sends_them(
    method: str, keep_alive: bool, declared: int | None, chunks: list[bytes], last_more: bool
) -> None:
    """A response's body, whole or in pieces, framed by its length or chunked, right or
    wrong for its ``Content-Length``: the same bytes, errors and end of the response,
    whether the cycle sends it itself (a whole body of the declared length) or uvicorn
    does (every other case)."""
    headers = [] if declared is None else [(b"content-length", b"%d" % declared)]
    start = {"type": "http.response.start", "status": 200, "headers": headers}

    async def outcome(kind: type[RequestResponseCycle]) -> tuple[object, ...]:
        cycle, out = _cycle(kind, method, keep_alive)
        ended: list[bool] = []
        cycle.on_response = lambda: ended.append(True)
        closed: list[bool] = []
        out.close = lambda: closed.append(True)  # type: ignore[attr-defined]
        events: list[object] = []
        try:
            await cycle.send(dict(start))
            for i, chunk in enumerate(chunks):
                more = i < len(chunks) - 1 or last_more
                await cycle.send({"type": "http.response.body", "body": chunk, "more_body": more})
        except RuntimeError as e:
            events.append(("raised", str(e)))
        state = (cycle.response_complete, cycle.message_event.is_set(), cycle.keep_alive)
        return (out.written, events, ended, closed, state, cycle.expected_content_length)

    async def go() -> None:
        assert await outcome(CheckedHeadersCycle) == await outcome(RequestResponseCycle)

    asyncio.run(go())


def test_request_event_behaves_as_asyncio_event() -> None:
    """Waiters wake on ``set`` (one cancelled meanwhile does not stop the others), a
    set event is waited for at once, ``clear`` makes waits block again."""
    from app.http_cycle import RequestEvent

    async def story(event: Any) -> list[object]:
        seen: list[object] = [event.is_set()]
        first = asyncio.ensure_future(event.wait())
        second = asyncio.ensure_future(event.wait())
        await asyncio.sleep(0)
        second.cancel()
        await asyncio.sleep(0)
        seen += [first.done(), second.cancelled()]
        event.set()
        await asyncio.sleep(0)
        seen += [first.result(), event.is_set(), await event.wait()]
        event.clear()
        late = asyncio.ensure_future(event.wait())
        await asyncio.sleep(0)
        seen += [event.is_set(), late.done()]
        event.set()
        event.set()
        await asyncio.sleep(0)
        seen.append(late.result())
        return seen

    async def go() -> None:
        expected = await story(asyncio.Event())
        assert expected == [False, False, True, True, True, True, False, False, True]
        assert await story(RequestEvent()) == expected

    asyncio.run(go())
