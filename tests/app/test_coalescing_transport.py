"""``CoalescingTransport``: what is written during one turn of the event loop leaves at
its end, in order, in one call to the transport (``writelines`` for several pieces, so
that nothing joins them into a copy); closing sends what is gathered first."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from app.http_protocol import CoalescingTransport


class Recording:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes]]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", [data]))

    def writelines(self, pieces: list[bytes]) -> None:
        self.calls.append(("writelines", list(pieces)))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append(("close", []))
        self.closing = True


def _coalescing() -> tuple[CoalescingTransport, Recording]:
    under = Recording()
    loop = asyncio.get_running_loop()
    return CoalescingTransport(cast(Any, under), loop), under


def test_one_turns_writes_leave_together_in_order() -> None:
    async def go() -> None:
        transport, under = _coalescing()
        transport.write(b"head")
        transport.write(b"")
        transport.write(b"body")
        assert under.calls == []  # not before the turn ends
        await asyncio.sleep(0)
        assert under.calls == [("writelines", [b"head", b"body"])]
        transport.write(b"alone")
        await asyncio.sleep(0)
        assert under.calls[1:] == [("write", [b"alone"])]
        transport.write(b"last")
        transport.close()
        assert under.calls[2:] == [("write", [b"last"]), ("close", [])]
        await asyncio.sleep(0)
        assert len(under.calls) == 4

    asyncio.run(go())


def test_nothing_is_written_to_a_closing_transport() -> None:
    async def go() -> None:
        transport, under = _coalescing()
        transport.write(b"late")
        under.closing = True
        await asyncio.sleep(0)
        assert under.calls == []

    asyncio.run(go())


# --- the request body as it arrives --------------------------------------------------


class Socketless:
    """What uvicorn's protocol asks of its transport; what it writes is kept."""

    def __init__(self) -> None:
        self.written = b""

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else None

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, pieces: list[bytes]) -> None:
        self.written += b"".join(pieces)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers each request with its body as the app read it, and how many reads."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message["body"])
        if not message["more_body"]:
            break
    answer = b"%d:" % len(chunks) + b"".join(chunks)
    length = [(b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": answer})


def _request(body: bytes) -> bytes:
    return b"POST /x HTTP/1.1\r\nHost: q\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_a_body_in_pieces_reaches_the_app_whole_and_exact() -> None:
    """The body arrives in pieces (one, several, and a next request in the same
    read); the app reads each body once, byte for byte, in order."""
    import uvicorn
    from uvicorn.server import ServerState

    from app.http_protocol import http_protocol

    async def go() -> bytes:
        config = uvicorn.Config(_echo, lifespan="off", log_level="error")
        config.load()
        protocol = http_protocol(10.0)(config=config, server_state=ServerState(), app_state={})
        socketless = Socketless()
        protocol.connection_made(cast(Any, socketless))
        big = bytes(range(256)) * 400
        first, second = _request(big), _request(b"small")
        protocol.data_received(first[:50])
        protocol.data_received(first[50:70_000])
        protocol.data_received(first[70_000:] + second[:60])
        for _ in range(5):
            await asyncio.sleep(0)
        protocol.data_received(second[60:])
        for _ in range(5):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return socketless.written

    written = asyncio.run(go())
    answers = written.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 2
    assert answers[0].endswith(b"\r\n\r\n1:" + bytes(range(256)) * 400)
    assert answers[1].endswith(b"\r\n\r\n1:small")


def test_received_body_joins_only_several_chunks() -> None:
    from app.http_protocol import ReceivedBody

    assert bytes(ReceivedBody()) == b""
    one = b"x" * 1000
    held = ReceivedBody()
    held += one
    assert bytes(held) is one  # the chunk itself, not a copy
    held += b"yz"
    assert (len(held), bytes(held)) == (1002, one + b"yz")


# --- the keep-alive and header clocks on one timer -----------------------------------


class Closable(Socketless):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.closed_at: float | None = None

    def is_closing(self) -> bool:
        return self.closed_at is not None

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = self.loop.time()


async def _answered_connection(keep_alive_s: float, header_s: float) -> tuple[Any, Closable]:
    """A connection (keep-alive ``keep_alive_s``, headers due within ``header_s``) that
    was answered one request; the response is on the wire before the loop turns."""
    import uvicorn
    from uvicorn.server import ServerState

    from app.http_protocol import http_protocol

    config = uvicorn.Config(_echo, lifespan="off", log_level="error")
    config.timeout_keep_alive = keep_alive_s  # type: ignore[assignment]
    config.load()
    protocol = http_protocol(header_s)(config=config, server_state=ServerState(), app_state={})
    transport = Closable(asyncio.get_running_loop())
    protocol.connection_made(cast(Any, transport))
    protocol.data_received(_request(b"ping"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert transport.written.endswith(b"\r\n\r\n1:ping"), transport.written
    return protocol, transport


def test_an_idle_keep_alive_connection_is_closed_after_its_timeout() -> None:
    async def go() -> tuple[float, float | None]:
        protocol, transport = await _answered_connection(keep_alive_s=0.2, header_s=5.0)
        idle_since = asyncio.get_running_loop().time()
        await asyncio.sleep(1.0)
        protocol.connection_lost(None)
        return idle_since, transport.closed_at

    idle_since, closed_at = asyncio.run(go())
    assert closed_at is not None and 0.15 <= closed_at - idle_since < 0.9


def test_bytes_of_a_next_request_stop_the_keep_alive_clock_not_the_header_clock() -> None:
    """Part of a next request arrives before the keep-alive runs out: the connection is
    not idle, but its headers are late once the header clock runs out."""

    async def go() -> tuple[float, float | None, float | None]:
        protocol, transport = await _answered_connection(keep_alive_s=0.2, header_s=0.8)
        answered = asyncio.get_running_loop().time()
        protocol.data_received(b"POST /x HT")
        await asyncio.sleep(0.5)
        open_at_keep_alive = transport.closed_at
        await asyncio.sleep(1.0)
        protocol.connection_lost(None)
        return answered, open_at_keep_alive, transport.closed_at

    answered, open_at_keep_alive, closed_at = asyncio.run(go())
    assert open_at_keep_alive is None
    assert closed_at is not None and 0.7 <= closed_at - answered < 1.4


def test_a_connection_in_use_is_kept_open() -> None:
    """Requests one after the other, each within the keep-alive, the whole over several
    keep-alives and header timeouts: the connection stays open."""

    async def go() -> tuple[float | None, int]:
        protocol, transport = await _answered_connection(keep_alive_s=0.2, header_s=0.3)
        for _ in range(8):
            await asyncio.sleep(0.1)
            protocol.data_received(_request(b"ping"))
        await asyncio.sleep(0.01)
        closed_at = transport.closed_at
        protocol.connection_lost(None)
        return closed_at, transport.written.count(b"1:ping")

    closed_at, answers = asyncio.run(go())
    assert closed_at is None and answers == 9


def test_a_request_task_leaves_the_servers_tasks_as_it_ends() -> None:
    """uvicorn waits for the tasks in ``tasks`` at a graceful stop; a request's task is
    there while it runs and gone once it has answered."""

    async def go() -> None:
        protocol, transport = await _answered_connection(5.0, 10.0)
        assert not protocol.tasks
        protocol.data_received(_request(b"again"))
        assert len(protocol.tasks) == 1
        for _ in range(3):
            await asyncio.sleep(0)
        assert transport.written.endswith(b"\r\n\r\n1:again")
        assert not protocol.tasks
        protocol.connection_lost(None)

    asyncio.run(go())


def test_a_held_write_leaves_with_the_next_flush_or_write() -> None:
    """``hold`` schedules nothing: the held bytes leave at the next ``flush`` (a
    response's end), or with a later write at the end of its turn, in order."""

    async def go() -> None:
        transport, under = _coalescing()
        transport.hold(b"head")
        await asyncio.sleep(0)
        assert under.calls == []
        transport.flush()
        assert under.calls == [("write", [b"head"])]
        transport.hold(b"head2")
        transport.write(b"chunk")
        assert under.calls[1:] == []
        await asyncio.sleep(0)
        assert under.calls[1:] == [("writelines", [b"head2", b"chunk"])]
        transport.write(b"a")
        transport.flush()
        transport.write(b"b")  # the turn's flush, scheduled by "a", sends it
        await asyncio.sleep(0)
        assert under.calls[2:] == [("write", [b"a"]), ("write", [b"b"])]

    asyncio.run(go())


def test_a_small_answer_schedules_no_flush() -> None:
    """A whole answer (head and body of the declared length) leaves at the response's
    end, in one write, with no callback left on the loop to flush it again."""

    async def go() -> None:
        protocol, transport = await _answered_connection(5.0, 10.0)
        before = len(transport.written)
        loop = asyncio.get_running_loop()
        scheduled: list[object] = []
        call_soon = loop.call_soon

        def spy(callback: Any, *args: Any, **kwargs: Any) -> Any:
            scheduled.append(getattr(callback, "__name__", callback))
            return call_soon(callback, *args, **kwargs)

        loop.call_soon = spy  # type: ignore[method-assign]
        try:
            protocol.data_received(_request(b"pong"))
            for _ in range(3):
                await asyncio.sleep(0)
        finally:
            loop.call_soon = call_soon  # type: ignore[method-assign]
        assert transport.written[before:].endswith(b"\r\n\r\n1:pong")
        assert "_turn_ended" not in scheduled, scheduled
        protocol.connection_lost(None)

    asyncio.run(go())
