"""One authenticated connection between two nodes: what it writes, what it reads.

Rule: a ``Conn`` carries one lane to one peer (``engine.runtime.tcp_transport`` owns
them). Its writes are items queued in one turn of the loop and flushed as frames by a
``call_soon``, or at once when ``WRITE_AT_ONCE_BYTES`` are queued, refused once the
bytes not yet written reach the buffer cap; its reads cut frames, check their items and
hand them to the owner; a bad frame, an error or the end of the stream closes it, and
closing fails the calls awaiting answers on it with ``OutcomeUnknown``. Nothing it reads from the peer raises out of ``run``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Protocol, cast

from engine.errors import OutcomeUnknown
from engine.ids import NodeName
from engine.limits import Limits
from engine.runtime.rate_log import RateLimitedLog
from engine.runtime.tcp_frames import (
    FrameDecoder,
    FrameError,
    Item,
    Lane,
    decode_items,
    frames_of,
)
from engine.runtime.tcp_reader import FrameReader
from engine.runtime.wire import Chunks

WRITE_AT_ONCE_BYTES = 64 * 1024
"""Queued items of at least this many bytes are written at once, not by the flush at the
end of the loop's turn. A leader's append of a publish is on the path of its confirm,
and on a busy leader the rest of the turn (other requests' bodies parsed, their tasks
run) held it up by 0.4 ms at the median and 2 ms on average (three processes on two
loaded cores); a write this large costs its copy, not its system call, so batching it
with the turn's other items saved next to nothing. Small messages (heartbeats,
acknowledgements, many queues' small appends) still go together, one write per turn."""


class ConnOwner(Protocol):
    name: NodeName
    limits: Limits
    rate_log: RateLimitedLog
    frames_sent: int
    frames_received: int

    def on_item(self, conn: Conn, item: Item) -> None: ...

    def on_closed(self, conn: Conn, reason: str) -> None: ...


@dataclass(eq=False)
class Link:
    """What this node knows of one peer."""

    name: NodeName
    address: tuple[str, int]
    conns: dict[Lane, Conn] = field(default_factory=dict)
    drops: int = 0
    last_heard_s: float | None = None
    rtt_ms: float | None = None
    last_error: str | None = None
    down: bool = False
    """The last connection or dial failed: calls fail at once instead of waiting."""
    bulk_up: asyncio.Event = field(default_factory=asyncio.Event)


class Conn:
    """One authenticated connection to a peer: its lane's writes and reads."""

    def __init__(
        self,
        owner: ConnOwner,
        link: Link,
        lane: Lane,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: FrameDecoder,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.owner = owner
        self.link = link
        self.lane = lane
        self.reader = reader
        self.writer = writer
        self.decoder = decoder
        self.loop = loop
        self.cap_bytes = owner.limits.cluster_send_buffer_bytes_max
        self.pending: list[Chunks] = []
        self.pending_bytes = 0
        self.flush_scheduled = False
        self.calls: dict[int, asyncio.Future[object]] = {}
        """Calls sent on this connection, by id, awaiting their answers."""
        self.serving: set[asyncio.Task[None]] = set()
        """The peer's calls running here."""
        self.last_received_s = self.last_sent_s = self.loop.time()
        self.frames_sent = 0
        self.closed = False
        self._ended: asyncio.Future[str] | None = None
        """Why the connection ended, once it did (``run`` awaits it)."""

    def buffered_bytes(self) -> int:
        if self.closed:
            return 0
        return self.pending_bytes + self.writer.transport.get_write_buffer_size()

    def enqueue(self, item: Chunks) -> bool:
        """Queue ``item`` for this turn's frame; False if the buffer has no room."""
        if self.closed or self.buffered_bytes() + item.size > self.cap_bytes:
            return False
        self.pending.append(item)
        self.pending_bytes += item.size
        if self.pending_bytes >= WRITE_AT_ONCE_BYTES and not self.writer.transport.is_closing():
            # A flush already scheduled finds nothing left and returns. A closing
            # connection is left to that flush, which closes it outside the sender's call.
            self._write_pending()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)
        return True

    def answer(self, item: Chunks) -> None:
        if not self.enqueue(item):
            self.link.drops += 1

    def flush(self) -> None:
        self.flush_scheduled = False
        self._write_pending()

    def _write_pending(self) -> None:
        items, self.pending, self.pending_bytes = self.pending, [], 0
        if self.closed or not items:
            return
        if self.writer.transport.is_closing():
            self.close("the connection is closing")
            return
        frames = frames_of(items, self.owner.limits.cluster_frame_bytes_max)
        # One write of every frame's buffers (writev): an entry's bytes are not copied
        # before the socket's.
        self.writer.writelines([part for data in frames for part in data.parts])
        self.frames_sent += len(frames)
        self.owner.frames_sent += len(frames)
        self.last_sent_s = self.loop.time()

    async def run(self) -> None:
        """Read and dispatch until the connection ends; then close it."""
        reason = "cancelled"
        try:
            reason = await self._read()
        except OSError as e:
            reason = describe(e)
        finally:
            self.close(reason)

    async def _read(self) -> str:
        """Frames until the connection ends; why it did. A ``FrameReader`` takes the
        connection over from the handshake's stream: first the bytes the handshake's
        reads left (in the decoder, in the stream), then the socket's."""
        ended: asyncio.Future[str] = self.loop.create_future()
        self._ended = ended
        transport = cast(asyncio.Transport, self.writer.transport)
        reader = FrameReader(self.decoder.frame_bytes_max, self._dispatch, self._read_ended)
        # Nothing arrives while the reader takes over, so no byte overtakes another.
        transport.pause_reading()
        transport.set_protocol(reader)
        self.reader.feed_eof()
        left = self.decoder.take_buffered() + await self.reader.read()
        if left:
            self._heard()
            reader.feed(left)
        if transport.is_closing():
            self._read_ended(None)
        else:
            transport.resume_reading()
        return await ended

    def _read_ended(self, error: BaseException | None) -> None:
        """From the reader: the connection ended, or what it read was refused."""
        if error is None:
            reason = "closed by the peer"
        elif isinstance(error, FrameError):
            reason = f"bad frame: {error}"
            self.owner.rate_log.warning(
                "bad-frame",
                "%s: closing the connection to %s: %s",
                self.owner.name,
                self.link.name,
                reason,
            )
        elif isinstance(error, OSError):
            reason = describe(error)
        else:
            reason = "internal error"
            self.owner.rate_log.log(
                logging.ERROR,
                "read-bug",
                "reading from %s: %s",
                self.link.name,
                describe(error),
                exc_info=True,  # the reader tells from within its ``except``
            )
        self.close(reason)

    def _heard(self) -> None:
        self.last_received_s = self.link.last_heard_s = self.loop.time()

    def _dispatch(self, payload: memoryview) -> bool:
        """Hand a frame's items to the owner; False once the connection is closed. The
        payload is the reader's buffer: the items decoded from it keep none of it."""
        self._heard()
        owner = self.owner
        owner.frames_received += 1
        for item in decode_items(payload):
            owner.on_item(self, item)
        return not self.closed

    def close(self, reason: str, *, abort: bool = False) -> None:
        """Close the connection (``abort``: at once, dropping what is not written); its
        outstanding calls raise ``OutcomeUnknown``."""
        if self.closed:
            return
        self.closed = True
        if abort:
            self.writer.transport.abort()
        else:
            self.writer.close()
        self.pending, self.pending_bytes = [], 0
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(reason)
        calls, self.calls = self.calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(
                    OutcomeUnknown(f"node {self.link.name}: connection lost ({reason})")
                )
        for task in self.serving:
            task.cancel()
        self.owner.on_closed(self, reason)


def describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


__all__ = ["Conn", "ConnOwner", "Link", "describe"]
