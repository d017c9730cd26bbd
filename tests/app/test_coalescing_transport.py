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
