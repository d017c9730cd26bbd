"""The TCP transport on 127.0.0.1: Raft messages and calls between real sockets, the
handshake refusing what does not belong, strangers and bad frames cut off, deadlines,
reconnects, bounded buffers and the control lane."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from engine.errors import Backpressure, Conflict, NoLeader, OutcomeUnknown, QueueNotFound
from engine.ids import NodeName, ServerId
from engine.limits import DEFAULT_LIMITS, MIB, Limits
from engine.raft.entry import Entry, EntryKind
from engine.raft.messages import AppendRequest, Heartbeat, Message, SnapshotChunk
from engine.runtime import tcp_handshake as handshake
from engine.runtime.routing import (
    AddMemberCall,
    DeleteReplica,
    JoinCall,
    Joined,
    NodeCall,
    PublishCall,
    ReceiveCall,
)
from engine.runtime.tcp_conn import WRITE_AT_ONCE_BYTES
from engine.runtime.tcp_frames import (
    HANDSHAKE_FRAME_BYTES_MAX,
    PROTOCOL_VERSION,
    FrameDecoder,
    Hello,
    Kind,
    Lane,
    decode_handshake,
    encode_handshake,
    encode_hello,
    encode_item,
    frame,
    limits_fingerprint,
)
from engine.runtime.tcp_join import request_join
from engine.runtime.tcp_transport import TcpTransport, TlsConfig, call_deadline_ms
from tests.engine.runtime.util import eventually, run

SECRET = b"cluster-secret-for-tests"
LIMITS = dataclasses.replace(
    DEFAULT_LIMITS,
    cluster_reconnect_ms_min=10,
    cluster_reconnect_ms_max=100,
    cluster_handshake_timeout_ms=1_000,
)
QUIET = dataclasses.replace(
    LIMITS, cluster_ping_interval_ms=60_000, cluster_idle_timeout_ms=240_000
)
"""No pings for the length of a test: the frames counted are the test's own."""
LOCAL = "127.0.0.1"


class Recorder:
    """A node's receiving side that records what it gets. Calls: ``DeleteReplica(uid)``
    answers ``"<src>:<uid>"``; uid ``missing`` raises ``QueueNotFound``, ``hang`` never
    answers."""

    def __init__(self) -> None:
        self.messages: list[tuple[NodeName, str, Message]] = []
        self.calls: list[tuple[NodeName, NodeCall]] = []

    def on_raft_message(self, src: NodeName, uid: str, message: Message) -> None:
        self.messages.append((src, uid, message))

    async def on_call(self, src: NodeName, call: NodeCall) -> object:
        self.calls.append((src, call))
        assert isinstance(call, DeleteReplica)
        if call.uid == "missing":
            raise QueueNotFound(f"no queue {call.uid}")
        if call.uid == "hang":
            await asyncio.sleep(3600)
        return f"{src}:{call.uid}"


def heartbeat(src: str, dst: str, commit: int = 0) -> Heartbeat:
    return Heartbeat(
        src=ServerId(f"{src}/g"), dst=ServerId(f"{dst}/g"), term=1, commit=commit, read_seq=0
    )


def append(src: str, dst: str, size: int, index: int = 1) -> AppendRequest:
    entry = Entry(index, 1, EntryKind.COMMAND, 0, b"a" * size)
    return AppendRequest(
        src=ServerId(f"{src}/g"), dst=ServerId(f"{dst}/g"), term=1, prev_index=0, prev_term=0,
        entries=[entry], commit=0,
    )  # fmt: skip


def chunk(src: str, dst: str, offset: int, size: int) -> SnapshotChunk:
    return SnapshotChunk(
        src=ServerId(f"{src}/g"), dst=ServerId(f"{dst}/g"), term=1, snapshot_index=9,
        snapshot_term=1, offset=offset, data=b"s" * size, done=False,
    )  # fmt: skip


def reading(writer: asyncio.StreamWriter) -> asyncio.Transport:
    """The transport under a stream, to pause its reading (a peer that stops reading)."""
    return cast(asyncio.Transport, writer.transport)


class Cluster:
    """Transports started highest name first, so that each dialer knows the port of
    every node it dials (a node only dials higher names)."""

    def __init__(self) -> None:
        self.transports: dict[str, TcpTransport] = {}
        self.receivers: dict[str, Recorder] = {}
        self.ports: dict[str, int] = {}

    async def start(self, name: str, peers: list[str], port: int = 0, **kw: Any) -> TcpTransport:
        options: dict[str, Any] = {"cluster_id": "c1", "secret": SECRET, "limits": LIMITS}
        options.update(kw)
        transport = TcpTransport(
            NodeName(name),
            listen=(LOCAL, port),
            peers={NodeName(p): (LOCAL, self.ports.get(p, 1)) for p in peers},
            **options,
        )
        self.receivers[name] = Recorder()
        transport.attach(NodeName(name), self.receivers[name])
        await transport.start()
        self.transports[name] = transport
        self.ports[name] = transport.listen_port
        return transport

    async def start_all(self, names: list[str], **kw: Any) -> None:
        for name in sorted(names, reverse=True):
            await self.start(name, [p for p in names if p != name], **kw)

    def connected(self, a: str, b: str) -> bool:
        return self.transports[a].health()[NodeName(b)].connected

    async def all_connected(self) -> None:
        names = list(self.transports)
        await eventually(
            lambda: all(self.connected(a, b) for a in names for b in names if a != b), 5
        )

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()


@asynccontextmanager
async def cluster(names: list[str], **kw: Any) -> AsyncIterator[Cluster]:
    c = Cluster()
    try:
        await c.start_all(names, **kw)
        yield c
    finally:
        await c.close()


def test_two_nodes_exchange_raft_messages_and_calls_both_ways() -> None:
    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            a, b = c.transports["n1"], c.transports["n2"]
            a.send(NodeName("n2"), "g", heartbeat("n1", "n2", 7))
            b.send(NodeName("n1"), "g", append("n2", "n1", 100))
            await eventually(
                lambda: bool(c.receivers["n2"].messages and c.receivers["n1"].messages)
            )
            assert c.receivers["n2"].messages == [("n1", "g", heartbeat("n1", "n2", 7))]
            assert c.receivers["n1"].messages == [("n2", "g", append("n2", "n1", 100))]
            assert await a.call(NodeName("n2"), DeleteReplica("u1")) == "n1:u1"
            assert await b.call(NodeName("n1"), DeleteReplica("u2")) == "n2:u2"
            with pytest.raises(QueueNotFound, match="no queue missing"):
                await a.call(NodeName("n2"), DeleteReplica("missing"))
            answers = await asyncio.gather(
                *(b.call(NodeName("n1"), DeleteReplica(f"x{k}")) for k in range(50))
            )
            assert answers == [f"n2:x{k}" for k in range(50)]
            health = a.health()[NodeName("n2")]
            assert health.drops == 0 and health.last_error is None
            assert health.last_heard_ms is not None and health.last_heard_ms < 5_000

    run(body(), 30)


def test_three_nodes_every_pair_both_ways() -> None:
    names = ["n1", "n2", "n3"]

    async def body() -> None:
        async with cluster(names) as c:
            await c.all_connected()
            for src in names:
                for dst in names:
                    if src != dst:
                        c.transports[src].send(NodeName(dst), "g", heartbeat(src, dst))
                        answer = await c.transports[src].call(NodeName(dst), DeleteReplica("u"))
                        assert answer == f"{src}:u"
            await eventually(lambda: all(len(c.receivers[n].messages) == 2 for n in names))
            for dst in names:
                got = sorted((src, m.dst) for src, _uid, m in c.receivers[dst].messages)
                assert got == [(src, f"{dst}/g") for src in names if src != dst]
            assert c.transports["n2"].nodes() == names

    run(body(), 30)


@asynccontextmanager
async def quiet_pair() -> AsyncIterator[tuple[Cluster, TcpTransport]]:
    """Nodes n1 and n2 connected without pings, and n1's transport, settled."""
    async with cluster(["n1", "n2"], limits=QUIET) as c:
        await c.all_connected()
        await asyncio.sleep(0.05)
        yield c, c.transports["n1"]


def test_the_messages_of_one_turn_go_in_one_frame_per_lane() -> None:
    async def body() -> None:
        async with quiet_pair() as (c, a):
            before = a.frames_sent
            for k in range(200):
                a.send(NodeName("n2"), "g", heartbeat("n1", "n2", k))
            for k in range(10):
                a.send(NodeName("n2"), "g", append("n1", "n2", 10, k + 1))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert a.frames_sent - before == 2  # one per lane
            await eventually(lambda: len(c.receivers["n2"].messages) == 210)
            commits = [
                m.commit for _s, _u, m in c.receivers["n2"].messages if isinstance(m, Heartbeat)
            ]
            assert commits == list(range(200))

    run(body(), 30)


def test_a_large_append_is_written_at_once_with_what_was_queued_before_it() -> None:
    async def body() -> None:
        async with quiet_pair() as (c, a):
            before = a.frames_sent
            for k in range(3):
                a.send(NodeName("n2"), "g", append("n1", "n2", 10, k + 1))
            assert a.frames_sent == before  # small ones wait for the end of the turn
            a.send(NodeName("n2"), "g", append("n1", "n2", WRITE_AT_ONCE_BYTES, 4))
            assert a.frames_sent == before + 1  # written before the turn ends, in one frame
            a.send(NodeName("n2"), "g", append("n1", "n2", 10, 5))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert a.frames_sent == before + 2
            await eventually(lambda: len(c.receivers["n2"].messages) == 5)
            got = [m.entries[0].index for _s, _u, m in c.receivers["n2"].messages]
            assert got == [1, 2, 3, 4, 5]

    run(body(), 30)


@pytest.mark.parametrize("wrong", ["n1", "n2"])
def test_a_node_with_another_secret_is_refused_both_ways(wrong: str) -> None:
    """Whichever side holds the wrong secret, the other side's proof fails: neither
    connects, both say why in their health."""

    async def body() -> None:
        c = Cluster()
        try:
            for name, peer in (("n2", "n1"), ("n1", "n2")):
                secret = b"another-secret" if name == wrong else SECRET
                await c.start(name, [peer], secret=secret)
            a, b = c.transports["n1"], c.transports["n2"]

            def refused() -> bool:
                return bool(a.health()[NodeName("n2")].last_error) and bool(
                    b.health()[NodeName("n1")].last_error
                )

            await eventually(refused, 5)
            await asyncio.sleep(0.2)
            assert not c.connected("n1", "n2") and not c.connected("n2", "n1")
            assert "secret" in (a.health()[NodeName("n2")].last_error or "")
            assert "secret" in (b.health()[NodeName("n1")].last_error or "")
            a.send(NodeName("n2"), "g", heartbeat("n1", "n2"))
            with pytest.raises(NoLeader):
                await a.call(NodeName("n2"), DeleteReplica("u"))
            await asyncio.sleep(0.1)
            assert c.receivers["n2"].messages == [] and c.receivers["n2"].calls == []
        finally:
            await c.close()

    run(body(), 30)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cluster_id": "c2"}, "cluster id 'c2' is not this node's cluster"),
        (
            {"limits": dataclasses.replace(LIMITS, cluster_ping_interval_ms=200)},
            "engine limits differ",
        ),
    ],
)
def test_another_cluster_or_other_limits_are_refused(change: dict[str, Any], reason: str) -> None:
    async def body() -> None:
        c = Cluster()
        try:
            await c.start("n2", ["n1"])
            a = await c.start("n1", ["n2"], **change)
            b = c.transports["n2"]
            await eventually(lambda: bool(b.health()[NodeName("n1")].last_error), 5)
            await eventually(lambda: bool(a.health()[NodeName("n2")].last_error), 5)
            assert reason in (b.health()[NodeName("n1")].last_error or "")
            assert f"refused by n2: {reason}" in (a.health()[NodeName("n2")].last_error or "")
            assert not c.connected("n1", "n2")
        finally:
            await c.close()

    run(body(), 30)


async def _cut_off(port: int, data: bytes) -> bytes:
    """Connect, send ``data``, and read until the node closes the connection."""
    reader, writer = await asyncio.open_connection(LOCAL, port)
    try:
        writer.write(data)
        async with asyncio.timeout(3):
            return await reader.read(-1)
    finally:
        writer.close()


def test_strangers_speaking_garbage_are_cut_off_and_the_peers_served() -> None:
    hello = Hello(PROTOCOL_VERSION, "c1", "n1", "n2", 0, limits_fingerprint(LIMITS), os.urandom(32))
    garbage = [
        os.urandom(2000),
        b"\xff\xff\xff\xff" + os.urandom(100),
        (HANDSHAKE_FRAME_BYTES_MAX + 1).to_bytes(4, "big"),
        frame(os.urandom(300)),
        frame(b"\x91\x93\x00\xa1g\xc0"),  # a Raft item where a hello belongs
        b"\x00\x00",  # then silence: the handshake times out
        encode_hello(hello) + frame(b"\x81\xa1t\xa5proof"),  # a hello, then junk
        encode_hello(hello) + frame(b"\x82\xa1t\xa5proof\xa3mac\xc4\x20" + b"m" * 32),
    ]

    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            b = c.transports["n2"]
            replies = await asyncio.gather(*(_cut_off(c.ports["n2"], g) for g in garbage))
            # Nothing but refusals came back; none of them is a welcome.
            assert all(b"welcome" not in r for r in replies)
            assert b"bad MAC" in replies[-1]
            # The last one claimed to be n1: its refusal is told in n1's health.
            assert b.strangers_refused == len(garbage) - 1
            assert "bad MAC" in (b.health()[NodeName("n1")].last_error or "")
            assert c.connected("n1", "n2")
            assert await c.transports["n1"].call(NodeName("n2"), DeleteReplica("u")) == "n1:u"
            assert c.receivers["n2"].messages == []

    run(body(), 30)


async def _fake_dialer(
    c: Cluster, name: str, dst: str, lane: Lane
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An authenticated peer ``name`` speaking for itself, for a test to misbehave."""
    reader, writer = await asyncio.open_connection(LOCAL, c.ports[dst])
    me = handshake.Identity(NodeName(name), "c1", SECRET, limits_fingerprint(LIMITS))
    decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
    await handshake.dial(reader, writer, decoder, me, NodeName(dst), lane)
    return reader, writer


def test_a_peer_sending_bad_frames_is_cut_off_and_the_others_served() -> None:
    bad_frames = [
        frame(os.urandom(500)),
        (LIMITS.cluster_frame_bytes_max + 1).to_bytes(4, "big"),
        frame(b"\x91" + encode_item(Kind.RAFT, "g", DeleteReplica("u")).joined()),
        frame(b"\x91\x93\x07\x01\xc0"),
        frame(b"\x92" + encode_item(Kind.RAFT, "g", heartbeat("n0", "n2")).joined() + b"\x93\x01"),
    ]

    async def body() -> None:
        # n2 knows a peer n0 (which dials it) that only the test speaks for.
        c = Cluster()
        try:
            await c.start("n2", ["n0", "n1"])
            await c.start("n1", ["n2"])
            await eventually(lambda: c.connected("n1", "n2") and c.connected("n2", "n1"))
            for data in bad_frames:
                reader, writer = await _fake_dialer(c, "n0", "n2", Lane.CONTROL)
                writer.write(data)
                async with asyncio.timeout(3):
                    assert await reader.read(-1) == b""  # closed by n2
                writer.close()
                error = c.transports["n2"].health()[NodeName("n0")].last_error or ""
                assert "bad frame" in error
            # The last frame held a good item, and a bad one: nothing of it was delivered.
            assert c.receivers["n2"].messages == []
            assert await c.transports["n1"].call(NodeName("n2"), DeleteReplica("u")) == "n1:u"
            c.transports["n1"].send(NodeName("n2"), "g", heartbeat("n1", "n2"))
            await eventually(lambda: len(c.receivers["n2"].messages) == 1)
        finally:
            await c.close()

    run(body(), 30)


class Raising(Recorder):
    def on_raft_message(self, src: NodeName, uid: str, message: Message) -> None:
        if isinstance(message, Heartbeat) and message.commit == 13:
            raise AssertionError("a bug of the receiving node")
        super().on_raft_message(src, uid, message)


def test_a_receiver_raising_loses_one_message_not_the_connection() -> None:
    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            c.receivers["n2"] = Raising()
            c.transports["n2"].attach(NodeName("n2"), c.receivers["n2"])
            for commit in (12, 13, 14):
                c.transports["n1"].send(NodeName("n2"), "g", heartbeat("n1", "n2", commit))
            await eventually(lambda: len(c.receivers["n2"].messages) == 2)
            got = [m.commit for _s, _u, m in c.receivers["n2"].messages if isinstance(m, Heartbeat)]
            assert got == [12, 14]
            assert c.connected("n1", "n2")

    run(body(), 30)


def test_a_call_at_start_up_waits_for_the_first_connection() -> None:
    async def body() -> None:
        c = Cluster()
        try:
            await c.start("n2", ["n1"])
            a = await c.start("n1", ["n2"])
            assert not c.connected("n1", "n2")
            assert await a.call(NodeName("n2"), DeleteReplica("u")) == "n1:u"
        finally:
            await c.close()

    run(body(), 30)


def test_a_call_past_its_deadline_raises_outcome_unknown() -> None:
    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            a = c.transports["n1"]
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(OutcomeUnknown, match="no answer to DeleteReplica in 200 ms"):
                await a.call(NodeName("n2"), DeleteReplica("hang"), deadline_ms=200)
            assert 0.2 <= loop.time() - started < 2
            assert await a.call(NodeName("n2"), DeleteReplica("u")) == "n1:u"

    run(body(), 30)


def test_each_method_has_its_deadline_and_a_long_poll_adds_its_wait() -> None:
    """A forwarded client operation is bounded by the leader's own bounds (a leader to
    appear, one proposal), a long-poll receive by that plus its wait; the calls of
    several steps (replicas, members) by the default deadline."""
    proposal_ms = LIMITS.leader_wait_ms + LIMITS.proposal_timeout_ms
    short = ReceiveCall("q", "c", 10, 0, None, [])
    long_poll = ReceiveCall("q", "c", 10, 20_000, None, [])
    assert call_deadline_ms(short, LIMITS) == proposal_ms
    assert call_deadline_ms(long_poll, LIMITS) == proposal_ms + 20_000
    assert call_deadline_ms(PublishCall("q", []), LIMITS) == proposal_ms
    assert proposal_ms < LIMITS.cluster_call_deadline_ms
    assert call_deadline_ms(DeleteReplica("u"), LIMITS) == LIMITS.cluster_call_deadline_ms
    assert call_deadline_ms(AddMemberCall("q", "n2"), LIMITS) == LIMITS.cluster_call_deadline_ms


def test_a_call_raises_outcome_unknown_when_the_peer_dies_mid_call() -> None:
    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            a = c.transports["n1"]
            loop = asyncio.get_running_loop()
            calls = [
                asyncio.create_task(a.call(NodeName("n2"), DeleteReplica("hang"))),
                asyncio.create_task(c.transports["n2"].call(NodeName("n1"), DeleteReplica("hang"))),
            ]
            await eventually(lambda: len(c.receivers["n2"].calls) == 1)
            started = loop.time()
            await c.transports["n2"].close()
            for task in calls:
                with pytest.raises(OutcomeUnknown):
                    await task
            assert loop.time() - started < 2
            await eventually(lambda: not c.connected("n1", "n2"))
            with pytest.raises(NoLeader, match="unreachable"):
                await a.call(NodeName("n2"), DeleteReplica("u"))

    run(body(), 30)


@pytest.mark.parametrize("restarted", ["n2", "n1"])
def test_the_pair_reconnects_after_a_node_restarts_on_its_port(restarted: str) -> None:
    """n1 dials n2: whether the acceptor or the dialer restarts, the pair comes back."""

    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            other = "n1" if restarted == "n2" else "n2"
            await c.transports[restarted].close()
            await eventually(lambda: not c.connected(other, restarted))
            await c.start(restarted, [other], port=c.ports[restarted])
            await c.all_connected()
            for src, dst in ((restarted, other), (other, restarted)):
                got = await c.transports[src].call(NodeName(dst), DeleteReplica("again"))
                assert got == f"{src}:again"
            c.transports[other].send(NodeName(restarted), "g", heartbeat(other, restarted))
            await eventually(lambda: len(c.receivers[restarted].messages) == 1)

    run(body(), 30)


SMALL = dataclasses.replace(
    LIMITS,
    entry_bytes_max=1 * MIB,
    batch_bytes_max=1 * MIB,
    message_bytes_max=1 * MIB,
    message_bytes_max_ceiling=1 * MIB,
    cluster_frame_bytes_max=2 * MIB,
    cluster_send_buffer_bytes_max=2 * MIB,
)


@asynccontextmanager
async def stalled_acceptor(name: str, limits: Limits) -> AsyncIterator[int]:
    """A node ``name`` that completes the handshake, then never reads again."""
    me = handshake.Identity(NodeName(name), "c1", SECRET, limits_fingerprint(limits))
    held: list[asyncio.StreamWriter] = []

    async def on_accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
        await handshake.accept(reader, writer, decoder, me, ["n1"])
        reading(writer).pause_reading()

    server = await asyncio.start_server(on_accept, LOCAL, 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.transport.abort()
        server.close()
        await server.wait_closed()


def test_the_buffer_to_a_stalled_peer_stays_bounded_and_drops() -> None:
    async def body() -> None:
        async with stalled_acceptor("n2", SMALL) as port:
            c = Cluster()
            c.ports["n2"] = port
            try:
                a = await c.start("n1", ["n2"], limits=SMALL)
                await eventually(lambda: c.connected("n1", "n2"))
                buffered_max = 0
                for round_ in range(60):
                    for k in range(8):
                        a.send(
                            NodeName("n2"), "g", append("n1", "n2", 64 * 1024, round_ * 8 + k + 1)
                        )
                    health = a.health()[NodeName("n2")]
                    buffered_max = max(buffered_max, health.buffered_bytes)
                    await asyncio.sleep(0.002)
                health = a.health()[NodeName("n2")]
                assert health.drops > 100, health
                assert health.connected
                assert 0 < buffered_max <= SMALL.cluster_send_buffer_bytes_max
                # A call that does not fit in what room is left is refused, not queued.
                with pytest.raises(Backpressure, match="too many bytes"):
                    await a.call(NodeName("n2"), DeleteReplica("u" * 100_000))
            finally:
                await c.close()

    run(body(), 30)


def test_a_silent_peer_is_disconnected_after_the_idle_timeout() -> None:
    brief = dataclasses.replace(LIMITS, cluster_ping_interval_ms=50, cluster_idle_timeout_ms=300)

    async def body() -> None:
        async with stalled_acceptor("n2", brief) as port:
            c = Cluster()
            c.ports["n2"] = port
            try:
                await c.start("n1", ["n2"], limits=brief)
                await eventually(lambda: c.connected("n1", "n2"))
                health = c.transports["n1"].health()[NodeName("n2")]
                await eventually(
                    lambda: (
                        "nothing heard for 300 ms"
                        in (c.transports["n1"].health()[NodeName("n2")].last_error or "")
                    ),
                    5,
                )
                assert health.connected  # it was, until then
            finally:
                await c.close()

    run(body(), 30)


def test_heartbeats_overtake_a_backlog_of_snapshot_chunks() -> None:
    """n2 stops reading its bulk connection: the chunks pile up in the socket buffers
    and n1's; a heartbeat sent after them arrives at once on the control lane."""

    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            a, got = c.transports["n1"], c.receivers["n2"].messages
            bulk = c.transports["n2"]._conn(NodeName("n1"), Lane.BULK)
            assert bulk is not None
            reading(bulk.writer).pause_reading()
            size, count = 512 * 1024, 40
            for k in range(count):
                a.send(NodeName("n2"), "g", chunk("n1", "n2", k * size, size))
            await asyncio.sleep(0.05)
            assert a.health()[NodeName("n2")].buffered_bytes > 0  # a backlog
            a.send(NodeName("n2"), "g", heartbeat("n1", "n2", 42))
            await eventually(lambda: any(isinstance(m, Heartbeat) for _s, _u, m in got), 2)
            assert sum(isinstance(m, SnapshotChunk) for _s, _u, m in got) < count
            reading(bulk.writer).resume_reading()
            await eventually(lambda: len(got) == count + 1, 10)
            assert a.health()[NodeName("n2")].drops == 0

    run(body(), 30)


def test_unauthenticated_connections_are_capped() -> None:
    capped = dataclasses.replace(LIMITS, cluster_handshakes_inflight_max=2)

    async def body() -> None:
        async with cluster(["n1", "n2"], limits=capped) as c:
            await c.all_connected()
            idle = [await asyncio.open_connection(LOCAL, c.ports["n2"]) for _ in range(2)]
            await asyncio.sleep(0.05)
            started = asyncio.get_running_loop().time()
            assert await _cut_off(c.ports["n2"], b"") == b""  # the third: closed at once
            assert asyncio.get_running_loop().time() - started < 0.5
            for _reader, writer in idle:
                writer.close()
            assert await c.transports["n1"].call(NodeName("n2"), DeleteReplica("u")) == "n1:u"

    run(body(), 30)


# --- TLS --------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(where: Path, ca: str, nodes: list[str]) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
             "-subj", f"/CN={ca}", "-days", "1", cwd=where)  # fmt: skip
    for node in nodes:
        _openssl("req", *ec, "-keyout", f"{node}.key", "-out", f"{node}.csr",
                 "-subj", f"/CN={node}", cwd=where)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{node}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-out", f"{node}.pem", "-days", "1", cwd=where)  # fmt: skip


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    where = tmp_path_factory.mktemp("tls")
    _certificates(where, "ca", ["n1", "n2"])
    _certificates(where, "other-ca", ["stranger"])
    return where


def _tls(where: Path, node: str, ca: str = "ca") -> TlsConfig:
    return TlsConfig(
        str(where / f"{node}.pem"), str(where / f"{node}.key"), str(where / f"{ca}.pem")
    )


def test_mutual_tls_carries_the_cluster_and_refuses_another_ca(certificates: Path) -> None:
    async def body() -> None:
        c = Cluster()
        try:
            await c.start("n2", ["n1"], tls=_tls(certificates, "n2"))
            a = await c.start("n1", ["n2"], tls=_tls(certificates, "n1"))
            await c.all_connected()
            assert await a.call(NodeName("n2"), DeleteReplica("u")) == "n1:u"
            assert await c.transports["n2"].call(NodeName("n1"), DeleteReplica("v")) == "n2:v"
            await a.close()
            del c.transports["n1"]
            # With the secret, trusting the cluster's CA, but with a certificate of
            # another CA: the listener, which requires one of its CA, refuses it.
            outsider = await c.start("n1", ["n2"], tls=_tls(certificates, "stranger"))
            await eventually(lambda: bool(outsider.health()[NodeName("n2")].last_error), 5)
            assert not c.connected("n1", "n2") and not c.connected("n2", "n1")
            await outsider.close()
            del c.transports["n1"]
            # And a listener with a certificate of another CA is not trusted.
            await c.transports["n2"].close()
            del c.transports["n2"]
            await c.start("n2", ["n1"], tls=_tls(certificates, "stranger", "other-ca"))
            a = await c.start("n1", ["n2"], tls=_tls(certificates, "n1"))
            await eventually(lambda: bool(a.health()[NodeName("n2")].last_error), 5)
            assert "certificate verify failed" in (a.health()[NodeName("n2")].last_error or "")
            assert not c.connected("n1", "n2")
        finally:
            await c.close()

    run(body(), 30)


def test_peers_learned_later_are_reached_and_forgotten_ones_no_longer() -> None:
    async def body() -> None:
        c = Cluster()
        try:
            b = await c.start("n2", [])
            a = await c.start("n1", [])
            assert a.nodes() == ["n1"] and a.health() == {}
            a.learn_peers({NodeName("n2"): (LOCAL, c.ports["n2"])}, [])
            # n2 accepts n1 only once it knows n1 as a peer: refused until then.
            await eventually(lambda: a.health()[NodeName("n2")].last_error is not None)
            b.learn_peers({NodeName("n1"): (LOCAL, c.ports["n1"])}, [])
            await c.all_connected()
            assert a.nodes() == b.nodes() == ["n1", "n2"]
            assert await a.call(NodeName("n2"), DeleteReplica("u")) == "n1:u"
            told: dict[str, list[str]] = {"n1": [], "n2": []}
            a.on_forgotten, b.on_forgotten = told["n1"].append, told["n2"].append
            # n2 forgets n1 first: it closes their connections, and tells n1 when it dials.
            b.learn_peers({}, [NodeName("n1")])
            assert b.nodes() == ["n2"] and b.health() == {}
            await eventually(lambda: not c.connected("n1", "n2"))
            await eventually(lambda: bool(told["n1"]), what="n1 told")
            assert (
                told["n1"][0] == "n2 says the cluster forgot node n1 (its replicas were replaced)"
            )
            assert not c.receivers["n1"].calls and not told["n2"]
            # n1 forgets n2: it no longer connects, only tells n2 (which it dials).
            a.learn_peers({NodeName("n2"): (LOCAL, 1)}, [NodeName("n2")])
            assert a.nodes() == ["n1"]
            with pytest.raises(NoLeader, match="not reachable"):
                await a.call(NodeName("n2"), DeleteReplica("u"))
            await eventually(lambda: bool(told["n2"]), what="n2 told")
            assert "the cluster forgot node n2" in told["n2"][0]
        finally:
            await c.close()

    run(body(), 30)


def lost(name: str, incarnation: str) -> str | None:
    """The check of a node whose metadata knows n1 from "d1" and n2 from "d2"."""
    recorded = {"n1": "d1", "n2": "d2"}
    if recorded.get(name, incarnation) == incarnation:
        return None
    return f"node {name} started before from another data directory"


@pytest.mark.parametrize("stale", ["n1", "n2"])
def test_a_peer_from_another_data_directory_is_told_so_whichever_side_dials(stale: str) -> None:
    """n1 dials n2. The node whose data directory the other does not know it from is
    told so by a MAC'd frame (as dialer or as acceptor) and never connects."""

    async def body() -> None:
        c = Cluster()
        try:
            ids = {"n1": "d1", "n2": "d2", stale: "fresh"}
            b = await c.start("n2", ["n1"], incarnation=ids["n2"])
            a = await c.start("n1", [], incarnation=ids["n1"])
            told: dict[str, list[str]] = {"n1": [], "n2": []}
            for name, transport in (("n1", a), ("n2", b)):
                transport.refuse_stale(lost)
                transport.on_lost_data = told[name].append
                transport.on_forgotten = told[name].append
            a.learn_peers({NodeName("n2"): (LOCAL, c.ports["n2"])}, [])
            await eventually(lambda: bool(told[stale]), what=f"{stale} told")
            other = "n2" if stale == "n1" else "n1"
            assert told[stale][0].startswith(
                f"{other} says the cluster knows node {stale} from another data directory"
            )
            assert "/api/v1/cluster/nodes/" in told[stale][0] and not told[other]
            assert not c.connected("n1", "n2")
            assert not c.receivers["n1"].calls and not c.receivers["n2"].calls
        finally:
            await c.close()

    run(body(), 30)


class JoinDesk(Recorder):
    """Answers a ``JoinCall``: n9 is known elsewhere (``Conflict``), others join."""

    async def on_call(self, src: NodeName, call: NodeCall) -> object:
        self.calls.append((src, call))
        assert isinstance(call, JoinCall)
        if call.node == "n9":
            raise Conflict("node n9 is known at 127.0.0.1:1")
        return Joined("c1", {"n1": "127.0.0.1:1", call.node: call.address})


def test_a_node_joins_through_any_node_with_the_secret_and_one_call() -> None:
    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            desk = JoinDesk()
            c.transports["n2"].attach(NodeName("n2"), desk)
            address = (LOCAL, c.ports["n2"])
            fingerprint = limits_fingerprint(LIMITS)
            me = handshake.Identity(NodeName("n3"), "", SECRET, fingerprint)
            joined = await request_join(address, me, JoinCall("n3", "h:3"), LIMITS)
            assert joined == Joined("c1", {"n1": "127.0.0.1:1", "n3": "h:3"})
            assert desk.calls == [("n3", JoinCall("n3", "h:3"))]
            nine = handshake.Identity(NodeName("n9"), "", SECRET, fingerprint)
            with pytest.raises(Conflict, match="known at"):
                await request_join(address, nine, JoinCall("n9", "h:9"), LIMITS)
            stranger = handshake.Identity(NodeName("n4"), "", b"another-secret-123", fingerprint)
            with pytest.raises(handshake.HandshakeRefused, match="cluster secret"):
                await request_join(address, stranger, JoinCall("n4", "h:4"), LIMITS)
            assert len(desk.calls) == 2
            # The join connections closed; the peers' stay up.
            assert c.connected("n1", "n2")

    run(body(), 30)


@pytest.mark.parametrize("tag", ["forgotten", "lost_data"])
def test_only_a_node_with_the_secret_can_tell_a_node_it_is_refused(tag: str) -> None:
    """A stranger that read a challenge answers with a made-up "forgotten" or
    "lost_data" MAC: the node is told nothing and its peers stay connected."""

    async def body() -> None:
        async with cluster(["n1", "n2"]) as c:
            await c.all_connected()
            told: list[str] = []
            c.transports["n2"].on_forgotten = told.append
            c.transports["n2"].on_lost_data = told.append
            reader, writer = await asyncio.open_connection(LOCAL, c.ports["n2"])
            hello = Hello(
                PROTOCOL_VERSION,
                "c1",
                "n1",
                "n2",
                int(Lane.CONTROL),
                limits_fingerprint(LIMITS),
                os.urandom(32),
            )
            writer.write(encode_hello(hello))
            decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES_MAX)
            answer, _fields = decode_handshake(await handshake.read_frame(reader, decoder))
            assert answer == "challenge"
            writer.write(encode_handshake(tag, mac=b"x" * 32))
            await eventually(lambda: c.transports["n2"].strangers_refused > 0 or reader.at_eof())
            writer.close()
            await asyncio.sleep(0.2)
            assert told == [] and c.connected("n1", "n2")

    run(body(), 30)
