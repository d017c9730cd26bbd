"""The fault-injecting proxy (``bench/_proxy.py``) between a blocking client and an echo
server that speaks the cluster's framing: what each fault does to whole frames."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from bench._proxy import Direction, FaultProxy, ProxyLoop
from tests.cluster.echo import QUIET_S, EchoServer, closed, frame, handshake, recv_frame


@pytest.fixture(scope="module")
def loop() -> Iterator[ProxyLoop]:
    proxy_loop = ProxyLoop()
    yield proxy_loop
    proxy_loop.close()


@pytest.fixture()
def echo(loop: ProxyLoop) -> Iterator[EchoServer]:
    server = EchoServer(loop).start()
    yield server
    server.close()


@pytest.fixture()
def proxy(loop: ProxyLoop, echo: EchoServer) -> Iterator[FaultProxy]:
    p = FaultProxy(("127.0.0.1", echo.port), loop).start()
    yield p
    p.close()


def dial(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=2.0)


def test_forwards_every_frame_both_ways_in_order(proxy: FaultProxy, echo: EchoServer) -> None:
    bodies = [f"m{i}".encode() * (i + 1) for i in range(50)] + [b""]
    with dial(proxy) as sock:
        sock.sendall(b"".join(frame(b) for b in bodies))
        assert [recv_frame(sock) for _ in bodies] == bodies
    assert echo.received == bodies
    counters = proxy.counters()
    assert counters.connections == 1
    assert counters.frames_forwarded == {"up": 51, "down": 51}
    assert counters.frames_dropped == counters.frames_blocked == {"up": 0, "down": 0}


def test_cut_closes_every_connection_and_refuses_new_ones_until_heal(proxy: FaultProxy) -> None:
    with dial(proxy) as first, dial(proxy) as second:
        for sock in (first, second):
            sock.sendall(frame(b"x"))
            assert recv_frame(sock) == b"x"
        proxy.cut()
        assert closed(first) and closed(second)
    with dial(proxy) as refused:
        assert closed(refused)
    assert proxy.counters().refused == 1
    proxy.heal()
    with dial(proxy) as again:
        again.sendall(frame(b"y"))
        assert recv_frame(again) == b"y"
    assert proxy.counters().connections == 3


def test_delay_holds_each_frame_and_keeps_their_order(proxy: FaultProxy) -> None:
    with dial(proxy) as sock:
        sock.sendall(frame(b"warm"))  # the connection to the target is made
        assert recv_frame(sock) == b"warm"
        proxy.delay_ms(100)
        bodies = [str(i).encode() for i in range(20)]
        started = time.monotonic()
        sock.sendall(b"".join(frame(b) for b in bodies))
        assert recv_frame(sock) == b"0"
        first_s = time.monotonic() - started
        assert [recv_frame(sock) for _ in bodies[1:]] == bodies[1:]
        all_s = time.monotonic() - started
    # Each frame waits 100 ms on the way up and again on the way back; the waits of
    # frames sent together overlap instead of adding up.
    assert 0.2 <= first_s < 0.6 and all_s < 0.8


def test_drop_loses_whole_frames_but_never_the_handshake(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    proxy.drop(1.0)
    with dial(proxy) as sock:
        handshake(sock)  # frames 1 to 4 pass even at p = 1
        sock.sendall(frame(b"lost"))
        assert recv_frame(sock, QUIET_S) is None
    assert echo.received == [b"hello", b"auth"]

    proxy.drop(0.3, seed=7)
    bodies = [str(i).encode() for i in range(200)]
    with dial(proxy) as sock:
        handshake(sock)
        sock.sendall(b"".join(frame(b) for b in bodies))
        echoed = []
        while (body := recv_frame(sock, QUIET_S)) is not None:
            echoed.append(body)
    arrived = echo.received[4:]
    # What got through, each way, is in order and whole; about 30% was lost each way.
    assert arrived == sorted(arrived, key=int) and set(arrived) <= set(bodies)
    assert echoed == sorted(echoed, key=int) and set(echoed) <= set(arrived)
    assert 200 * 0.5 < len(arrived) < 200 * 0.9 and len(arrived) * 0.5 < len(echoed)
    counters = proxy.counters()
    assert counters.frames_dropped["up"] == 1 + 200 - len(arrived)
    assert counters.frames_dropped["down"] == len(arrived) - len(echoed)


@pytest.mark.parametrize("direction", ["up", "down"])
def test_block_discards_one_direction_after_the_handshake(
    proxy: FaultProxy, echo: EchoServer, direction: Direction
) -> None:
    proxy.block(direction)
    with dial(proxy) as sock:
        handshake(sock)
        sock.sendall(frame(b"one-way"))
        assert recv_frame(sock, QUIET_S) is None  # either way, no echo comes back
        expected = [b"hello", b"auth"] + ([b"one-way"] if direction == "down" else [])
        assert echo.received == expected
        proxy.heal()
        sock.sendall(frame(b"healed"))  # the same connection flows again
        assert recv_frame(sock) == b"healed"
    counters = proxy.counters()
    assert counters.frames_blocked[direction] == 1 == sum(counters.frames_blocked.values())


def test_handshake_frames_is_a_parameter(loop: ProxyLoop, echo: EchoServer) -> None:
    proxy = FaultProxy(("127.0.0.1", echo.port), loop, handshake_frames=0).start()
    try:
        proxy.drop(1.0)
        with dial(proxy) as sock:
            sock.sendall(frame(b"first"))
            assert recv_frame(sock, QUIET_S) is None
        assert echo.received == []
    finally:
        proxy.close()


def test_unreachable_target_closes_the_dialer(loop: ProxyLoop) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        proxy = FaultProxy(("127.0.0.1", port), loop).start()
        try:
            with dial(proxy) as sock:
                assert closed(sock)
            assert proxy.counters().connect_failures == 1
        finally:
            proxy.close()


def test_a_frame_longer_than_the_cap_closes_the_connection(
    loop: ProxyLoop, echo: EchoServer
) -> None:
    proxy = FaultProxy(("127.0.0.1", echo.port), loop, frame_bytes_max=1024).start()
    try:
        with dial(proxy) as sock:
            sock.sendall(frame(b"a" * 1024))
            assert recv_frame(sock) == b"a" * 1024
            sock.sendall((1025).to_bytes(4, "big"))
            assert closed(sock)
    finally:
        proxy.close()
