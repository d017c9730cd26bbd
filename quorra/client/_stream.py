"""Streams: publish with confirms and consume with a prefetch credit on one WebSocket
(``GET /api/v1/queues/{name}/stream``), blocking (``Stream``) or asyncio
(``AsyncStream``). The frames are in README.md, "Streams"; ``Ledger`` keeps the books.

Rule: ``publish`` sends at once while the window has room and otherwise reads frames
until it has; a publish is durable only once confirmed (``wait``, ``flush``). Deliveries
are kept in order until taken; the server sends no more than the prefetch credit, so
what is kept is bounded by it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as sync_connect

from quorra.client import _async_ws as async_ws
from quorra.client._async_ws import ClientWebSocket
from quorra.client._ledger import Ledger, PublishFailed, consume_frame, stream_url, unpack
from quorra.client._types import Delivery, Problem, Publishable, message_map

OPEN_TIMEOUT_S = 10.0
FRAME_BYTES_MAX = 64 * 1024 * 1024
"""The largest frame the client reads (a deliver frame of 1,000 large messages)."""


def _denied(e: InvalidStatus) -> Problem:
    """The HTTP problem the server answered the handshake with."""
    response = e.response
    try:
        body: object = json.loads(bytes(response.body or b""))
    except ValueError:
        body = None
    return Problem.of(body, response.status_code)


def _closed(e: ConnectionClosed) -> Problem:
    reason = e.rcvd.reason if e.rcvd is not None else ""
    return Problem(499, "about:blank", "Stream closed", reason or str(e))


class Stream:
    """A blocking stream on one queue. Use as a context manager (closing returns the
    leases of deliveries not yet acked)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        queue: str,
        *,
        window_messages: int | None = None,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> None:
        try:
            self._ws: ClientConnection = sync_connect(
                stream_url(base_url, queue),
                additional_headers={"Authorization": f"Bearer {token}"},
                open_timeout=open_timeout_s,
                max_size=FRAME_BYTES_MAX,
                compression=None,
                legacy=True,  # a connection to keep, not a context of its own
            )
        except InvalidStatus as e:
            raise _denied(e) from None
        self.ledger = Ledger(unpack(self._ws.recv(open_timeout_s)), window_messages)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._ws.close()

    def read(self, timeout_s: float | None) -> bool:
        """Read one frame into the ledger; False when none came in ``timeout_s``."""
        try:
            data = self._ws.recv(timeout_s)
        except TimeoutError:
            return False
        except ConnectionClosed as e:
            raise _closed(e) from None
        self.ledger.on_frame(unpack(data))
        return True

    def _send(self, frame: bytes) -> None:
        try:
            self._ws.send(frame)
        except ConnectionClosed as e:
            raise _closed(e) from None

    # --- publishing -----------------------------------------------------------------

    def publish(self, messages: Sequence[Publishable], *, dedup_id: str | None = None) -> int:
        """Send one publish frame (1..1000 messages, all or nothing) once the window has
        room; its seq. Durable once confirmed: see ``wait`` and ``flush``. With a
        ``dedup_id`` (the frame's; its messages then carry none), a frame sent again with
        the same id within the queue's dedup window is confirmed and enqueues nothing."""
        return self.publish_maps([message_map(m) for m in messages], dedup_id=dedup_id)

    def publish_maps(
        self, maps: Sequence[Mapping[str, object]], *, dedup_id: str | None = None
    ) -> int:
        """As ``publish`` for messages in their wire form (``Ledger.publish_frame_of_maps``)."""
        while not self.ledger.room_for(len(maps)):
            self.read(None)
        seq, frame = self.ledger.publish_frame_of_maps(maps, dedup_id)
        self._send(frame)
        return seq

    def publish_packed(
        self, count: int, packed: Sequence[bytes | memoryview], *, dedup_id: str | None = None
    ) -> int:
        """As ``publish`` for ``count`` messages already packed
        (``Ledger.publish_frame_of_packed``)."""
        while not self.ledger.room_for(count):
            self.read(None)
        seq, frame = self.ledger.publish_frame_of_packed(count, packed, dedup_id)
        self._send(frame)
        return seq

    def wait(self, seq: int, timeout_s: float | None = None) -> None:
        """Until publish ``seq`` is confirmed; ``PublishFailed`` if it was refused."""
        while not self.ledger.done(seq):
            if not self.read(timeout_s):
                raise TimeoutError(f"publish {seq} not confirmed in {timeout_s} s")
        if seq in self.ledger.failures:
            self.ledger.take_failures()

    def flush(self, timeout_s: float | None = None) -> None:
        """Until every publish is answered; ``PublishFailed`` for those refused."""
        while self.ledger.outstanding:
            if not self.read(timeout_s):
                raise TimeoutError(f"publishes not confirmed in {timeout_s} s")
        self.ledger.take_failures()

    # --- consuming ------------------------------------------------------------------

    def consume(
        self,
        prefetch: int,
        *,
        lease_ms: int | None = None,
        consumer: str | None = None,
        columns: bool = False,
    ) -> None:
        """Ask for deliveries, at most ``prefetch`` unsettled at a time (0 stops). With
        ``columns``, each deliver frame comes columnar and lands in
        ``ledger.delivered_columns`` (``DeliveredColumns``), not in ``receive``'s list."""
        self._send(consume_frame(prefetch, lease_ms, consumer, columns))

    def receive(self, timeout_s: float | None = None) -> list[Delivery]:
        """The deliveries read so far, waiting up to ``timeout_s`` for the first."""
        ledger = self.ledger
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not ledger.deliveries:  # other frames (confirms, settles) may come first
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.read(left):
                break
        while ledger.deliveries and self.read(0):  # whatever else has arrived
            pass
        out = list(ledger.deliveries)
        ledger.deliveries.clear()
        return out

    def ack(self, receipts: list[str], *, ref: int | str | None = None) -> None:
        """Settle; the answer (``settled`` frame) is read later, into
        ``ledger.answers[ref]`` when a ``ref`` is given."""
        self._send(self.ledger.settle_frame("ack", receipts, ref=ref))

    def nack(
        self, receipts: list[str], *, requeue: bool = True, ref: int | str | None = None
    ) -> None:
        self._send(self.ledger.settle_frame("nack", receipts, requeue=requeue, ref=ref))

    def extend(self, receipts: list[str], lease_ms: int, *, ref: int | str | None = None) -> None:
        self._send(self.ledger.settle_frame("extend", receipts, lease_ms=lease_ms, ref=ref))


class AsyncStream:
    """The asyncio stream: ``await AsyncStream.open(...)`` or ``async with``; each frame
    goes into the ledger as it arrives (``_async_ws``), then wakes the caller."""

    ledger: Ledger
    """Made of the first frame, ``ready`` (``open`` returns once it came)."""

    def __init__(self, window_messages: int | None) -> None:
        self._window_messages = window_messages
        self._opened = False
        self._changed = asyncio.Event()
        self._error: Problem | None = None
        self._ws: ClientWebSocket | None = None

    @classmethod
    async def open(
        cls,
        base_url: str,
        token: str,
        queue: str,
        *,
        window_messages: int | None = None,
        open_timeout_s: float = OPEN_TIMEOUT_S,
    ) -> AsyncStream:
        stream = cls(window_messages)
        try:
            stream._ws = await async_ws.connect(
                stream_url(base_url, queue),
                {"Authorization": f"Bearer {token}"},
                on_message=stream._on_message,
                open_timeout_s=open_timeout_s,
                max_size=FRAME_BYTES_MAX,
            )
        except InvalidStatus as e:
            raise _denied(e) from None
        stream._watch(stream._ws)
        try:
            async with asyncio.timeout(open_timeout_s):
                await stream._until(lambda: stream._opened)
        except BaseException:
            await stream.close()
            raise
        return stream

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    def _on_message(self, data: bytes) -> None:
        """A frame, in the callback that read it: the first is ``ready``, every later one
        goes into the ledger. A frame the client cannot read ends the stream."""
        if self._error is not None:
            return
        try:
            frame = unpack(data)
            if self._opened:
                self.ledger.on_frame(frame)
            else:
                self.ledger = Ledger(frame, self._window_messages)
                self._opened = True
        except Problem as e:  # an error frame instead of ready
            self._error = e
        except Exception as e:  # a server this client does not understand
            self._error = Problem(499, "about:blank", "Stream closed", f"unreadable frame: {e}")
        if self._error is not None and self._ws is not None:
            self._ws.abort()
        self._changed.set()

    def _watch(self, ws: ClientWebSocket) -> None:
        """Once the connection is gone, every waiter fails with why."""

        def gone(_: object) -> None:
            if self._error is None:
                self._error = _closed(ws.close_error())
            self._changed.set()

        ws.closed.add_done_callback(gone)

    async def _until(self, condition: Any) -> None:
        while not condition():
            if self._error is not None:
                raise self._error
            self._changed.clear()
            await self._changed.wait()

    async def _send(self, frame: bytes) -> None:
        if self._error is not None:
            raise self._error
        assert self._ws is not None
        try:
            await self._ws.send(frame)
        except ConnectionClosed as e:
            raise _closed(e) from None

    async def publish(self, messages: Sequence[Publishable], *, dedup_id: str | None = None) -> int:
        """As ``Stream.publish``."""
        await self._until(lambda: self.ledger.room_for(len(messages)))
        seq, frame = self.ledger.publish_frame(messages, dedup_id)
        await self._send(frame)
        return seq

    async def wait(self, seq: int) -> None:
        await self._until(lambda: self.ledger.done(seq))
        if seq in self.ledger.failures:
            self.ledger.take_failures()

    async def flush(self) -> None:
        await self._until(lambda: not self.ledger.outstanding)
        self.ledger.take_failures()

    async def consume(
        self, prefetch: int, *, lease_ms: int | None = None, consumer: str | None = None
    ) -> None:
        await self._send(consume_frame(prefetch, lease_ms, consumer))

    async def receive(self) -> list[Delivery]:
        """The deliveries read so far, waiting for at least one."""
        await self._until(lambda: bool(self.ledger.deliveries))
        out = list(self.ledger.deliveries)
        self.ledger.deliveries.clear()
        return out

    async def deliveries(self) -> AsyncIterator[Delivery]:
        while True:
            for d in await self.receive():
                yield d

    async def ack(self, receipts: list[str], *, ref: int | str | None = None) -> None:
        await self._send(self.ledger.settle_frame("ack", receipts, ref=ref))

    async def nack(
        self, receipts: list[str], *, requeue: bool = True, ref: int | str | None = None
    ) -> None:
        await self._send(self.ledger.settle_frame("nack", receipts, requeue=requeue, ref=ref))

    async def extend(
        self, receipts: list[str], lease_ms: int, *, ref: int | str | None = None
    ) -> None:
        await self._send(self.ledger.settle_frame("extend", receipts, lease_ms=lease_ms, ref=ref))


__all__ = ["AsyncStream", "PublishFailed", "Stream"]
