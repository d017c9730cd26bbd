"""The transport between Quorra processes: TCP, authenticated, every Raft group on it.

Rule: between two nodes there are exactly two connections, one per ``Lane``, opened by
the node with the lower name (the other only accepts, from lower names): no race
between two dialers, no tie-break, and a dialer that reconnects replaces its old
connection. Each starts with the handshake of ``engine.runtime.tcp_handshake`` (over TLS
if configured); after it, frames of items (``engine.runtime.tcp_frames``).

* **Lanes.** Heartbeats, votes and every small answer go on the control connection;
  appends, snapshot chunks and calls on the bulk one. Two TCP connections rather than
  one with a priority writer: once bytes are in a socket's buffers (megabytes on a fast
  link) nothing can overtake them, so a heartbeat would wait behind whatever bulk bytes
  were written before it, longer than an election timeout on a slow link. With two, the
  kernel interleaves them and a heartbeat waits behind other small messages only.
* **Batching.** What is sent in one turn of the loop goes out in one frame per lane
  (split at ``Limits.cluster_frame_bytes_max``), flushed by a ``call_soon``.
* **Bounded buffers.** Per connection, the bytes not yet written to the socket (pending
  items and the asyncio transport's buffer) stay under
  ``Limits.cluster_send_buffer_bytes_max``: a Raft message beyond it, or to a peer not
  connected, is dropped and counted (Raft sends again); a call beyond it is refused
  with ``Backpressure``. A slow or dead peer costs a bounded amount of memory.
* **Calls** are multiplexed by id on the bulk lane (``engine.runtime.tcp_calls``); each
  has a deadline (``call_deadline_ms``: the default, plus its wait for a long-poll
  receive). A passed deadline or a dropped connection raises ``OutcomeUnknown``: the
  call may have run. A call to a peer known to be down raises ``NoLeader`` at once (it
  was never sent).
* **Liveness.** Each connection pings when it sent nothing for a ping interval (the
  control one always, for the round trip) and is closed after an idle timeout with
  nothing received. The dialer redials with jittered exponential back-off.
* **Peer bytes** never raise out of the receive path: a bad frame closes its
  connection, with a warning at a bounded rate, and the peer redials.
* **Peers change.** The nodes given at start are the first peers; ``learn_peers`` adds
  the nodes the cluster's metadata records later (dialing them by the same rule) and
  drops those it forgot: their connections close and no Raft message or call goes to
  them again. A forgotten node is only told that it was (``tcp_handshake``): when it
  dials, and by the node that dialed it, which now dials it only for that, at the
  longest back-off. A node told so hears of it through ``on_forgotten``. A node not in
  the cluster yet may join through any node: ``engine.runtime.tcp_join``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable, Collection, Mapping
from typing import Any, cast

from engine.errors import NoLeader
from engine.ids import NodeName
from engine.limits import Limits
from engine.raft.messages import Message
from engine.runtime import tcp_handshake as handshake
from engine.runtime.rate_log import RateLimitedLog
from engine.runtime.routing import NodeCall
from engine.runtime.tcp_calls import Calls, call_deadline_ms
from engine.runtime.tcp_conn import Conn, Link, describe
from engine.runtime.tcp_frames import (
    HANDSHAKE_FRAME_BYTES_MAX,
    FrameDecoder,
    FrameError,
    Item,
    Kind,
    Lane,
    encode_item,
    item_fits,
    lane_of,
    limits_fingerprint,
)
from engine.runtime.tcp_handshake import READ_BYTES, HandshakeRefused, Identity, TlsConfig
from engine.runtime.tcp_join import serve_join
from engine.runtime.transport import Peer, PeerHealth

log = logging.getLogger("quorra.engine")


class TcpTransport:
    """Implements ``Transport`` over TCP (see the module's rule)."""

    def __init__(
        self,
        name: NodeName,
        *,
        listen: tuple[str, int],
        peers: dict[NodeName, tuple[str, int]],
        cluster_id: str,
        secret: bytes,
        limits: Limits,
        tls: TlsConfig | None = None,
        incarnation: str = "",
    ) -> None:
        assert name not in peers, "a node is not its own peer"
        assert secret, "the cluster secret is not empty"
        self.name = NodeName(name)
        self.limits = limits
        self.identity = Identity(
            self.name, cluster_id, secret, limits_fingerprint(limits), incarnation
        )
        self._listen = listen
        self._tls = tls
        self._links = {NodeName(p): Link(NodeName(p), addr) for p, addr in peers.items()}
        self._dialers = frozenset(p for p in self._links if p < self.name)
        """The peers that dial this node: those with lower names."""
        self._dialing: dict[NodeName, list[asyncio.Task[Any]]] = {}
        """The dial loops of each peer this node dials (or tells it was forgotten)."""
        self._gone: set[NodeName] = set()
        """The nodes the cluster forgot."""
        self.on_forgotten: Callable[[str], None] | None = None
        """Told, with the reason, when a peer proves that the cluster forgot this node."""
        self.on_lost_data: Callable[[str], None] | None = None
        """Told, with the reason, when a peer proves that the cluster knows this node
        from another data directory."""
        self._receiver: Peer | None = None
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        """Dial loops and the keepalive: cancelled at close."""
        self._accepting: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        """The tasks of accepted connections, handshake and reading: ended by aborting
        their connections at close."""
        self._handshakes = 0
        """Accepted connections not authenticated yet."""
        self._closing = False
        self._random = random.Random()
        self.rate_log = RateLimitedLog(log)
        self._calls = Calls(self.name, limits, self.rate_log, lambda: self._receiver)
        self.frames_sent = 0
        self.frames_received = 0
        self.strangers_refused = 0
        """Connections closed before or during their handshake that named no peer."""

    # === Transport ====================================================================

    def nodes(self) -> list[NodeName]:
        return sorted([self.name, *self._links])

    def attach(self, name: NodeName, peer: Peer) -> None:
        assert name == self.name, name
        self._receiver = peer

    def detach(self, name: NodeName) -> None:
        self._receiver = None

    def send(self, dst: NodeName, uid: str, message: Message) -> None:
        link = self._links.get(dst)
        if link is None:
            return  # not a node of this cluster (a stale member): nothing to reach
        conn = link.conns.get(lane_of(message))
        if conn is None or conn.buffered_bytes() >= self.limits.cluster_send_buffer_bytes_max:
            link.drops += 1
            return
        item = encode_item(Kind.RAFT, uid, message)
        if not item_fits(item, self.limits.cluster_frame_bytes_max):
            link.drops += 1
            self.rate_log.warning(
                "too-large", "a Raft message of %d bytes to %s fits no frame", len(item), dst
            )
            return
        if not conn.enqueue(item):
            link.drops += 1

    async def call(
        self, dst: NodeName, call: NodeCall, *, deadline_ms: int | None = None
    ) -> object:
        """``call`` run on ``dst``: its answer, or its operating error; ``OutcomeUnknown``
        past the deadline (``call_deadline_ms`` unless given) or if the connection drops."""
        loop = self._need_loop()
        if deadline_ms is None:
            deadline_ms = call_deadline_ms(call, self.limits)
        deadline = loop.time() + deadline_ms / 1000
        conn = await self._call_conn(dst, deadline)
        return await self._calls.send(conn, call, deadline, deadline_ms)

    async def _call_conn(self, dst: NodeName, deadline: float) -> Conn:
        link = self._links.get(dst)
        if link is None or self._closing:
            raise NoLeader(f"node {dst} is not reachable from {self.name}")
        conn = link.conns.get(Lane.BULK)
        if conn is not None:
            return conn
        if link.down:
            raise NoLeader(f"node {dst} is unreachable ({link.last_error or 'disconnected'})")
        # Never connected yet (this node is starting): wait for the first connection.
        wait_until = min(deadline, self._need_loop().time() + self._handshake_s())
        try:
            async with asyncio.timeout_at(wait_until):
                await link.bulk_up.wait()
        except TimeoutError:
            raise NoLeader(f"node {dst} is not connected yet") from None
        conn = link.conns.get(Lane.BULK)
        if conn is None:
            raise NoLeader(f"node {dst} is unreachable")
        return conn

    # === life cycle ===================================================================

    async def start(self) -> None:
        """Listen, and dial the peers with higher names."""
        assert self._server is None, "started once"
        self._loop = asyncio.get_running_loop()
        host, port = self._listen
        tls: dict[str, Any] = {}
        if self._tls is not None:
            tls = {"ssl": self._tls.server_context(), "ssl_handshake_timeout": self._handshake_s()}
        self._server = await asyncio.start_server(
            self._on_accept, host, port, limit=READ_BYTES, **tls
        )
        for link in self._links.values():
            self._maybe_dial(link)
        self._spawn(self._keepalive())
        log.info("cluster transport of %s listening on %s:%d", self.name, host, self.listen_port)

    async def close(self) -> None:
        """Close every connection and task; outstanding calls raise ``OutcomeUnknown``."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = set(self._tasks)
        for link in self._links.values():
            for conn in list(link.conns.values()):
                tasks |= conn.serving
                conn.close(f"node {self.name} closed its transport", abort=True)
        for task in tasks:
            task.cancel()
        for writer in self._accepting.values():
            writer.transport.abort()
        await asyncio.gather(*tasks, *self._accepting, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def listen_port(self) -> int:
        assert self._server is not None, "started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def health(self) -> dict[NodeName, PeerHealth]:
        now = self._loop.time() if self._loop is not None else 0.0
        out: dict[NodeName, PeerHealth] = {}
        for name, link in sorted(self._links.items()):
            heard = link.last_heard_s
            out[name] = PeerHealth(
                connected=len(link.conns) == len(Lane),
                last_heard_ms=None if heard is None else int((now - heard) * 1000),
                drops=link.drops,
                buffered_bytes=sum(c.buffered_bytes() for c in link.conns.values()),
                rtt_ms=link.rtt_ms,
                last_error=link.last_error,
            )
        return out

    # === peers ========================================================================

    def learn_peers(
        self, peers: Mapping[NodeName, tuple[str, int]], gone: Collection[NodeName]
    ) -> None:
        """The cluster's nodes as its metadata records them: a peer not known yet is
        reached from now on, at the address recorded; a peer in ``gone`` is no longer
        reached, nor accepted (see the module's rule). A known peer keeps the address it
        has: the one given at start is how this node reaches it, which may differ from
        how the node that recorded it did (a proxy, another network)."""
        if self._closing:
            return
        for name, address in sorted(peers.items()):
            if name == self.name or name in gone:
                continue
            link = self._links.get(name)
            if link is None:
                if name in self._gone:  # its name joined again, as a new node
                    self._gone.discard(name)
                    for task in self._dialing.pop(name, []):
                        task.cancel()
                link = self._links[name] = Link(name, address)
                log.info("%s: learned peer %s at %s:%d", self.name, name, *address)
                if self._loop is not None:
                    self._maybe_dial(link)
        for name in sorted(gone):
            if name == self.name or name in self._gone:
                continue
            self._gone.add(name)
            link = self._links.pop(name, None)
            if link is None:
                continue
            log.info("%s: peer %s left the cluster", self.name, name)
            for task in self._dialing.pop(name, []):
                task.cancel()
            for conn in list(link.conns.values()):
                conn.close(f"node {name} left the cluster", abort=True)
            if self._loop is not None and self.name < name:
                self._dialing[name] = [self._spawn(self._tell_loop(name, link.address))]
        self._dialers = frozenset(p for p in self._links if p < self.name)

    def refuse_stale(self, check: Callable[[str, str], str | None]) -> None:
        """Refuse, and tell so, a peer that ``check`` says runs from a data directory
        the cluster does not know it from (``engine.runtime.tcp_handshake``)."""
        self.identity = dataclasses.replace(self.identity, stale=check)

    def _maybe_dial(self, link: Link) -> None:
        """Dial ``link`` on both lanes if this node is the one that dials it."""
        if self.name < link.name and link.name not in self._dialing:
            tasks = [self._spawn(self._dial_loop(link, lane)) for lane in Lane]
            self._dialing[link.name] = tasks

    # === connections ==================================================================

    async def _dial_loop(self, link: Link, lane: Lane) -> None:
        attempt = 0
        while not self._closing:
            conn = await self._dial_once(link, lane)
            if conn is None:
                attempt += 1
            else:
                attempt = 0
                await conn.run()
            await asyncio.sleep(self._backoff_s(attempt))

    async def _tell_loop(self, name: NodeName, address: tuple[str, int]) -> None:
        """Tell forgotten node ``name`` so whenever it is up, at the longest back-off."""
        tls = self._tls.client_context() if self._tls is not None else None
        while not self._closing:
            with contextlib.suppress(OSError, TimeoutError, FrameError, HandshakeRefused):
                # Down, most likely, when it fails: the next attempt tells it.
                async with asyncio.timeout(self._handshake_s()):
                    await handshake.tell_forgotten(address, self.identity, name, tls)
                log.info("%s: told %s that the cluster forgot it", self.name, name)
            await asyncio.sleep(self._backoff_s(30))

    async def _dial_once(self, link: Link, lane: Lane) -> Conn | None:
        host, port = link.address
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        tls = self._tls.client_context() if self._tls is not None else None
        writer: asyncio.StreamWriter | None = None
        conn: Conn | None = None
        try:
            async with asyncio.timeout(self._handshake_s()):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, limit=READ_BYTES
                )
                await handshake.dial(reader, writer, decoder, self.identity, link.name, lane)
            conn = self._register(link, lane, reader, writer, decoder)
        except HandshakeRefused as e:
            self._refused(e, f"{host}:{port}")
        except (OSError, TimeoutError, FrameError) as e:
            link.down = True
            link.last_error = f"dialing {host}:{port}: {describe(e)}"
            self.rate_log.warning("dial", "%s: %s", self.name, link.last_error)
        except Exception:
            link.down = True
            self.rate_log.log(logging.ERROR, "dial-bug", "dialing %s", link.name, exc_info=True)
        finally:
            if conn is None and writer is not None:
                writer.close()
        return conn

    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # asyncio runs this in a task of its own, which must end, not be cancelled (it
        # would log the cancellation as an error): ``close`` aborts the connection instead.
        if self._closing or self._handshakes >= self.limits.cluster_handshakes_inflight_max:
            self.strangers_refused += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._accepting[task] = writer
        try:
            conn = await self._accept_handshake(reader, writer)
            if conn is not None:
                await conn.run()
        finally:
            del self._accepting[task]

    async def _accept_handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Conn | None:
        where = _address(writer)
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        conn: Conn | None = None
        self._handshakes += 1
        try:
            async with asyncio.timeout(self._handshake_s()):
                peer, lane, joining = await handshake.accept(
                    reader, writer, decoder, self.identity, self._dialers, self._gone
                )
            if joining:
                await serve_join(reader, writer, decoder, peer, self.limits, self._on_join)
                return None
            link = self._links.get(peer)
            if link is None:
                raise HandshakeRefused(f"{peer} left the cluster during its handshake")
            conn = self._register(link, lane, reader, writer, decoder)
        except HandshakeRefused as e:
            self._refused(e, where)
        except (OSError, TimeoutError, FrameError) as e:
            self.strangers_refused += 1
            self.rate_log.warning("accept", "%s: dropped %s: %s", self.name, where, describe(e))
        except Exception:
            self.rate_log.log(logging.ERROR, "accept-bug", "accepting %s", where, exc_info=True)
        finally:
            self._handshakes -= 1
            if conn is None:
                writer.close()
        return conn

    def _register(
        self,
        link: Link,
        lane: Lane,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        decoder: FrameDecoder,
    ) -> Conn:
        """An authenticated connection carries ``lane`` to ``link`` from now on."""
        decoder.frame_bytes_max = self.limits.cluster_frame_bytes_max
        old = link.conns.get(lane)
        if old is not None:
            old.close("replaced by a newer connection")
        conn = Conn(self, link, lane, reader, writer, decoder, self._need_loop())
        link.conns[lane] = conn
        link.last_heard_s = conn.last_received_s
        link.down = False
        link.last_error = None
        if lane is Lane.BULK:
            link.bulk_up.set()
        self.rate_log.log(
            logging.INFO,
            "connected",
            "%s: connected to %s (%s lane)",
            self.name,
            link.name,
            lane.name,
        )
        return conn

    def on_closed(self, conn: Conn, reason: str) -> None:
        link = conn.link
        if link.conns.get(conn.lane) is not conn:
            return
        del link.conns[conn.lane]
        if conn.lane is Lane.BULK:
            link.bulk_up.clear()
        if not self._closing:
            link.down = True
            link.last_error = reason
            self.rate_log.log(
                logging.INFO, "closed", "%s: %s lane to %s closed: %s", self.name, conn.lane.name.lower(),
                link.name, reason,
            )  # fmt: skip

    def _refused(self, e: HandshakeRefused, where: str) -> None:
        if e.forgotten or e.lost_data:
            log.error("%s: %s", self.name, e.reason)
            told = self.on_forgotten if e.forgotten else self.on_lost_data
            if told is not None:
                told(e.reason)
        link = None if e.peer is None else self._links.get(e.peer)
        if link is None:
            self.strangers_refused += 1
        else:
            link.last_error = e.reason
            link.down = True
        self.rate_log.warning("refused", "%s: handshake with %s: %s", self.name, where, e.reason)

    # === what arrives =================================================================

    async def _on_join(self, src: NodeName, call: NodeCall) -> object:
        receiver = self._receiver
        if receiver is None:
            raise NoLeader(f"node {self.name} is not serving")
        return await receiver.on_call(src, call)

    def on_item(self, conn: Conn, item: Item) -> None:
        kind, key, value = item
        if kind is Kind.RAFT:
            self._deliver(conn.link.name, cast(str, key), cast(Message, value))
        elif kind is Kind.CALL:
            self._calls.serve(conn, cast(int, key), cast(NodeCall, value))
        elif kind is Kind.ANSWER or kind is Kind.FAILURE:
            self._calls.settle(conn, kind, cast(int, key), value)
        elif kind is Kind.PING:
            conn.enqueue(encode_item(Kind.PONG, key, None))
        elif kind is Kind.PONG and conn.lane is Lane.CONTROL:
            rtt_ms = (self._now_us() - cast(int, key)) / 1000
            if rtt_ms >= 0:
                conn.link.rtt_ms = rtt_ms

    def _deliver(self, src: NodeName, uid: str, message: Message) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        try:
            receiver.on_raft_message(src, uid, message)
        except Exception:
            # The node's contract is not to raise here; if it does, one message is lost
            # and the connection serves on.
            self.rate_log.log(logging.ERROR, "deliver", "a message from %s", src, exc_info=True)

    # === timers =======================================================================

    async def _keepalive(self) -> None:
        loop = self._need_loop()
        interval_s = self.limits.cluster_ping_interval_ms / 1000
        idle_s = self.limits.cluster_idle_timeout_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            now = loop.time()
            for link in self._links.values():
                for conn in list(link.conns.values()):
                    if now - conn.last_received_s > idle_s:
                        conn.close(f"nothing heard for {self.limits.cluster_idle_timeout_ms} ms")
                    elif conn.lane is Lane.CONTROL or now - conn.last_sent_s >= interval_s:
                        conn.enqueue(encode_item(Kind.PING, self._now_us(), None))

    def _backoff_s(self, attempt: int) -> float:
        """Doubles with each failed attempt from the min to the max, jittered down by up
        to half so that nodes restarted together do not dial in step."""
        low, high = self.limits.cluster_reconnect_ms_min, self.limits.cluster_reconnect_ms_max
        ceiling = min(high, low * 2 ** min(attempt, 30))
        return self._random.uniform(ceiling / 2, ceiling) / 1000

    def _handshake_s(self) -> float:
        return self.limits.cluster_handshake_timeout_ms / 1000

    def _now_us(self) -> int:
        return int(self._need_loop().time() * 1_000_000)

    def _need_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "the transport is started"
        return self._loop

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = self._need_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _conn(self, peer: NodeName, lane: Lane) -> Conn | None:
        """The connection carrying ``lane`` to ``peer``, if up (for tests)."""
        return self._links[peer].conns.get(lane)


def _address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


__all__ = ["TcpTransport", "TlsConfig", "call_deadline_ms"]
