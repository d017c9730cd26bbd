"""A TCP proxy that injects faults into the frames of the cluster protocol, for the
multi-process tests (``tests/cluster``) and the cluster bench.

Rule: the proxy forwards whole frames (a 4-byte big-endian length, then that many bytes,
the cluster's framing) and acts on frames, never on bytes: a dropped frame disappears
whole, so the receiver's framing never breaks and only what that frame carried is lost.
It does not look inside a frame.

The faults, each set by a call that returns once it took effect:

* ``cut()``: every connection is closed at once, and new ones are accepted and closed
  until ``heal()`` (a partition; the dialer sees its connection fail and retries);
* ``delay_ms(n)``: each frame is forwarded ``n`` ms after it was read, order kept;
* ``drop(p, seed)``: each frame is dropped with probability ``p``, drawn from a
  ``random.Random(seed)`` of this proxy;
* ``block(direction)``: every frame in one direction is discarded, a one-way partition:
  ``"up"`` is from the dialer to the target, ``"down"`` back;
* ``heal()``: clears every fault.

``drop`` and ``block`` never touch the first ``handshake_frames`` frames of a connection
(default 4), counted over both directions in the order the proxy reads them: they are
the authenticated handshake, which is a strict exchange (no other frame moves before it
ends), and a lost handshake frame would stall the connection instead of losing a
message. The partition is thus of messages, not of the link: a connection made during a
one-way partition behaves like one made before it. The default is the cluster's
handshake (``engine/runtime/tcp_handshake.py``: hello up, challenge down, proof up,
welcome down); keep the two in step. ``cut`` closes handshakes too.

The frames must be readable: with TLS between the nodes the proxy sees records, not
frames, and cannot act on them; run the nodes without TLS behind it.

Threading: a ``ProxyLoop`` runs one asyncio loop in a thread of its own; a test drives a
``FaultProxy`` synchronously from its own thread, each call running on that loop. Many
proxies share one loop (a cluster harness runs its n*(n-1) proxies on one).

This module is in ``bench/`` because ``quorra bench cluster`` is an installed command
that can import only installed packages, and it measures the cluster under the same
faults; the tests import it from here. The underscore keeps it out of the bench listing
(``bench.available()``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
import threading
from collections.abc import Coroutine
from typing import Any, Literal, Self, TypeVar

Direction = Literal["up", "down"]
DIRECTIONS: tuple[Direction, Direction] = ("up", "down")
HANDSHAKE_FRAMES_DEFAULT = 4
FRAME_BYTES_MAX_DEFAULT = 64 << 20
"""A frame announced longer than this closes the connection (it would sit in memory)."""
HEADER_BYTES = 4
QUEUED_FRAMES_MAX = 4096
"""Frames read but not yet forwarded, per direction of a connection; when full the proxy
stops reading, so a delayed link pushes back on its sender as a slow network does."""
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0

T = TypeVar("T")


class ProxyLoop:
    """An asyncio event loop running in a daemon thread, for proxies driven from others."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and return its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(CALL_TIMEOUT_S)

    def close(self) -> None:
        """Stop the loop; close the proxies on it first."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self.loop.close()


def _per_direction() -> dict[Direction, int]:
    return dict.fromkeys(DIRECTIONS, 0)


@dataclasses.dataclass
class ProxyCounters:
    """What a proxy has done since it started; ``FaultProxy.counters()`` gives a copy."""

    connections: int = 0
    """Connections accepted and joined to the target."""
    refused: int = 0
    """Connections accepted while cut, closed at once."""
    connect_failures: int = 0
    """Connections closed because the target could not be reached."""
    frames_read: dict[Direction, int] = dataclasses.field(default_factory=_per_direction)
    frames_forwarded: dict[Direction, int] = dataclasses.field(default_factory=_per_direction)
    frames_dropped: dict[Direction, int] = dataclasses.field(default_factory=_per_direction)
    """By ``drop``."""
    frames_blocked: dict[Direction, int] = dataclasses.field(default_factory=_per_direction)
    """By ``block``."""


class _Link:
    """One proxied connection: the dialer's stream, the target's, and the task serving them."""

    def __init__(self, dialer: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self.writers = (dialer, target)
        self.frames_read = 0
        self.task: asyncio.Task[None] | None = None

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

    def abort(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


class FaultProxy:
    """Listens on 127.0.0.1 (``port``, chosen by the system) and forwards each connection
    to ``target``, frame by frame, with the faults of the module docstring."""

    def __init__(
        self,
        target: tuple[str, int],
        loop: ProxyLoop,
        *,
        handshake_frames: int = HANDSHAKE_FRAMES_DEFAULT,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
    ) -> None:
        assert handshake_frames >= 0 and frame_bytes_max > 0
        self.target = target
        self.handshake_frames = handshake_frames
        self.frame_bytes_max = frame_bytes_max
        self._loop = loop
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._counters = ProxyCounters()
        self._cut = False
        self._delay_s = 0.0
        self._drop_p = 0.0
        self._rng = random.Random(0)
        self._blocked: set[Direction] = set()
        self.port = 0

    # --- driven from the test's thread -------------------------------------------

    def start(self) -> Self:
        self.port = self._loop.call(self._start())
        return self

    def close(self) -> None:
        self._loop.call(self._close())

    def cut(self) -> None:
        self._loop.call(self._set_cut())

    def heal(self) -> None:
        self._loop.call(self._heal())

    def delay_ms(self, ms: int) -> None:
        assert ms >= 0
        self._loop.call(self._set(_delay_s=ms / 1000))

    def drop(self, p: float, seed: int = 0) -> None:
        assert 0.0 <= p <= 1.0
        self._loop.call(self._set(_drop_p=p, _rng=random.Random(seed)))

    def block(self, direction: Direction) -> None:
        assert direction in DIRECTIONS
        self._loop.call(self._set(_blocked={*self._blocked, direction}))

    def counters(self) -> ProxyCounters:
        return self._loop.call(self._copy_counters())

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    # --- on the loop ---------------------------------------------------------------

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self._close_links()

    async def _set_cut(self) -> None:
        self._cut = True
        await self._close_links()

    async def _heal(self) -> None:
        self._cut, self._delay_s, self._drop_p, self._blocked = False, 0.0, 0.0, set()

    async def _set(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)

    async def _copy_counters(self) -> ProxyCounters:
        return copy.deepcopy(self._counters)

    async def _close_links(self) -> None:
        tasks = [link.task for link in self._links if link.task is not None]
        for link in list(self._links):
            link.abort()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            self._counters.refused += 1
            writer.transport.abort()
            return
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            self._counters.connect_failures += 1
            writer.transport.abort()
            return
        if self._cut:  # cut while connecting
            self._counters.refused += 1
            writer.transport.abort()
            target_writer.transport.abort()
            return
        link = _Link(writer, target_writer)
        # A task of the proxy's own serves the link, so that ``cut`` can cancel it (the
        # streams module logs the cancellation of its connection callback as an error).
        link.task = asyncio.create_task(self._serve(link, reader, target_reader))
        self._links.add(link)
        self._counters.connections += 1

    async def _serve(
        self, link: _Link, reader: asyncio.StreamReader, target_reader: asyncio.StreamReader
    ) -> None:
        dialer_writer, target_writer = link.writers
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(link, "up", reader, target_writer))
                group.create_task(self._pump(link, "down", target_reader, dialer_writer))
        finally:
            link.abort()
            self._links.discard(link)

    async def _pump(
        self,
        link: _Link,
        direction: Direction,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Forward one direction of ``link`` until either side ends; then close both."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUED_FRAMES_MAX)
        async with asyncio.TaskGroup() as group:
            group.create_task(self._read_frames(link, direction, reader, queue))
            group.create_task(self._write_frames(link, direction, writer, queue))

    async def _read_frames(
        self,
        link: _Link,
        direction: Direction,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                header = await reader.readexactly(HEADER_BYTES)
                length = int.from_bytes(header, "big")
                if length > self.frame_bytes_max:
                    break
                frame = header + await reader.readexactly(length)
                if self._passes(link, direction):
                    await queue.put((loop.time() + self._delay_s, frame))
        except (asyncio.IncompleteReadError, OSError):
            pass
        await queue.put(None)

    def _passes(self, link: _Link, direction: Direction) -> bool:
        """Whether the frame just read goes on; counts it either way."""
        link.frames_read += 1
        self._counters.frames_read[direction] += 1
        if link.frames_read <= self.handshake_frames:
            return True
        if direction in self._blocked:
            self._counters.frames_blocked[direction] += 1
            return False
        if self._drop_p > 0.0 and self._rng.random() < self._drop_p:
            self._counters.frames_dropped[direction] += 1
            return False
        return True

    async def _write_frames(
        self,
        link: _Link,
        direction: Direction,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        """Write each queued frame when it is due; at the end of the queue, or when the
        writing fails, close the link (and keep taking frames off the queue, so that its
        reader, which then sees the end of its stream too, never waits on a full queue)."""
        loop = asyncio.get_running_loop()
        open_ = True
        while (item := await queue.get()) is not None:
            if not open_:
                continue
            due, frame = item
            if (wait_s := due - loop.time()) > 0:
                await asyncio.sleep(wait_s)
            try:
                writer.write(frame)
                await writer.drain()
                self._counters.frames_forwarded[direction] += 1
            except OSError:
                open_ = False
                link.close()
        link.close()
