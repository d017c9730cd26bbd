"""The cluster harness itself: how it wires nodes to proxies, where its faults act, the
checker's verdict, and a single-node run under load through kill -9 and restart (the
form that works before the cluster transport exists)."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench._proxy import HANDSHAKE_FRAMES_DEFAULT, ProxyLoop
from tests.cluster.checker import Checker, verdict
from tests.cluster.echo import QUIET_S, EchoServer, closed, frame, handshake, recv_frame
from tests.cluster.harness import Cluster, ProxyMesh

StartCluster = Callable[[int], Cluster]


def test_verdict_passes_a_clean_run_with_redeliveries_and_unconfirmed_attempts() -> None:
    received = Counter({"a": 2, "b": 1, "c": 1})  # "c": attempted, outcome unknown, arrived
    assert verdict({"a", "b", "c", "d"}, {"a", "b"}, received, []) == []


def test_verdict_names_what_went_wrong() -> None:
    problems = verdict({"a", "b"}, {"a", "b"}, Counter({"a": 1, "z": 1}), ["publish on n1: 500"])
    assert problems == [
        "error: publish on n1: 500",
        "1 confirmed messages never received: ['b']",
        "1 received messages never published: ['z']",
    ]
    assert verdict(set(), set(), Counter(), []) == ["no publish was confirmed"]


def test_each_node_reaches_each_peer_through_its_own_proxy(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)  # proxies only: no server is started
    try:
        n1 = cluster.nodes["n1"]
        command = n1.command()
        assert command[command.index("--node-id") + 1] == "n1"
        assert command[command.index("--cluster-listen") + 1] == f"127.0.0.1:{n1.cluster_port}"
        via = {b: cluster.mesh.address("n1", b)[1] for b in ("n2", "n3")}
        peers = f"n2@127.0.0.1:{via['n2']},n3@127.0.0.1:{via['n3']}"
        assert command[command.index("--peers") + 1] == peers
        for (a, b), proxy in cluster.mesh.proxies.items():
            assert proxy.target == ("127.0.0.1", cluster.nodes[b].cluster_port), (a, b)
        assert (
            len(cluster.mesh.proxies) == 6
            and len({p.port for p in cluster.mesh.proxies.values()}) == 6
        )
        assert len({n.port for n in cluster.nodes.values()}) == 3
    finally:
        cluster.stop()
    single = Cluster(tmp_path / "single", 1)
    try:
        assert "--peers" not in single.nodes["n1"].command() and not single.mesh.proxies
    finally:
        single.stop()


@pytest.fixture()
def mesh() -> Iterator[tuple[ProxyMesh, dict[str, EchoServer]]]:
    """Two echo servers standing in for the cluster ports of n1 and n2, and their mesh."""
    loop = ProxyLoop()
    echoes = {name: EchoServer(loop).start() for name in ("n1", "n2")}
    targets = {name: ("127.0.0.1", e.port) for name, e in echoes.items()}
    proxies = ProxyMesh(targets, HANDSHAKE_FRAMES_DEFAULT)
    yield proxies, echoes
    proxies.close()
    for echo in echoes.values():
        echo.close()
    loop.close()


def dial(mesh: ProxyMesh, a: str, b: str) -> socket.socket:
    sock = socket.create_connection(mesh.address(a, b), timeout=2.0)
    try:
        handshake(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def test_one_way_stops_frames_from_src_to_dst_whoever_dialed(
    mesh: tuple[ProxyMesh, dict[str, EchoServer]],
) -> None:
    proxies, echoes = mesh
    proxies.one_way("n1", "n2")
    with dial(proxies, "n1", "n2") as n1_to_n2, dial(proxies, "n2", "n1") as n2_to_n1:
        n1_to_n2.sendall(frame(b"from n1"))  # to n2, on the connection n1 dialed
        n2_to_n1.sendall(frame(b"from n2"))  # to n1, on the connection n2 dialed
        # Neither echo comes back: n2's echo never got "from n1", and n1's echo of
        # "from n2" is a frame from n1 to n2 too.
        assert recv_frame(n1_to_n2, QUIET_S) is None and recv_frame(n2_to_n1, QUIET_S) is None
    assert echoes["n2"].received == [b"hello", b"auth"]  # nothing of n1's past the handshake
    assert echoes["n1"].received == [b"hello", b"auth", b"from n2"]


def test_partition_cuts_both_ways_until_heal(
    mesh: tuple[ProxyMesh, dict[str, EchoServer]],
) -> None:
    proxies, _ = mesh
    with dial(proxies, "n1", "n2") as n1_to_n2, dial(proxies, "n2", "n1") as n2_to_n1:
        proxies.partition(["n1"], ["n2"])
        assert closed(n1_to_n2) and closed(n2_to_n1)
    proxies.heal()
    with dial(proxies, "n2", "n1") as again:
        again.sendall(frame(b"healed"))
        assert recv_frame(again) == b"healed"


@pytest.mark.integration
def test_single_node_under_load_through_kill9_and_restart(start_cluster: StartCluster) -> None:
    cluster = start_cluster(1)
    queue = cluster.create_queue("load", lease_ms=2000)
    checker = Checker(queue, cluster.endpoints()).start()
    try:
        checker.wait_confirmed(50)
        cluster.kill9("n1")
        cluster.restart("n1")
        checker.wait_confirmed(checker.confirmed_count() + 50)
    finally:
        checker.stop()
    summary = checker.check()
    assert summary.publish_retries > 0  # publishes met the dead node, and were sent again
    assert summary.confirmed >= 100


@pytest.mark.integration
def test_the_checker_sees_a_message_it_never_published(start_cluster: StartCluster) -> None:
    cluster = start_cluster(1)
    queue = cluster.create_queue("strangers")
    stranger = {"messages": [{"body": "not from the checker"}]}
    assert (
        cluster.client("n1").post(f"/api/v1/queues/{queue}/messages", json=stranger).status_code
        == 201
    )
    checker = Checker(queue, cluster.endpoints()).start()
    try:
        checker.wait_confirmed(20)
    finally:
        checker.stop()
    with pytest.raises(AssertionError, match=r"1 received messages never published: \['not from"):
        checker.check()
