"""N ``quorra serve`` processes on 127.0.0.1, joined through fault-injecting proxies, for
the multi-process tests of the cluster.

Each node (``n1``, ``n2``, ...) has its own data directory, HTTP port and cluster port,
all kept across restarts, so that clients and peers keep their addresses. Between every
ordered pair (a, b) runs a ``FaultProxy`` (``bench/_proxy.py``) forwarding to b's cluster
port, and a's ``--peers`` names b at that proxy's address: a connection that a dials to b
crosses proxy (a, b), frames from a to b going "up" and frames from b to a "down". A
message from a to b thus crosses exactly one proxy whichever of the two dialed: up on
(a, b) or down on (b, a). The faults act on those proxies:

* ``partition(group_a, group_b)``: both proxies of every pair across the groups cut;
* ``one_way(src, dst)``: frames from ``src`` to ``dst`` discarded, on both proxies of the
  pair (up on (src, dst), down on (dst, src)), the other way untouched;
* ``delay(ms)``: every frame held ``ms`` on its one proxy, so each message is ``ms`` late;
* ``loss(p)``: every frame dropped with probability ``p`` (past each connection's
  handshake, see the proxy), each proxy with a seed of its own;
* ``heal()``: all of it undone.

A one-node cluster has no peers and no proxies, and its server gets no cluster flags: it
runs single-node exactly as a server does today. The cluster flags and settings are those
of CLUSTER_PLAN.md: ``--node-id``, ``--cluster-listen``, ``--peers`` and the shared secret
in ``QUORRA_CLUSTER_SECRET``. Every node's admin is ``admin`` with ``ADMIN_PASSWORD``
(``QUORRA_ADMIN_PASSWORD``, the bootstrap admin of a first start); ``token(node)`` trades
it for a bearer token on that node.

``join(name, via)`` adds a node to the running cluster: it starts with ``--join`` at
``via``'s cluster port (no proxy: the faults above do not act on a joined node's traffic).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import httpx

from bench._proxy import HANDSHAKE_FRAMES_DEFAULT, FaultProxy, ProxyLoop
from tests.app.conftest import ADMIN_PASSWORD, Server, free_port, make_token
from tests.cluster.checker import Endpoint

HOST = "127.0.0.1"
WAIT_S = 20.0
"""How long the harness waits for a token or a leader before it fails the test."""
POLL_S = 0.1
CAUGHT_UP_LAG_MAX = 20
"""Entries a follower may trail the leader by and count as caught up, under a steady load."""
CLUSTER_START_TIMEOUT_S = 60.0
"""Three servers starting at once on a loaded 2-core machine took 20-34 s to answer
``/readyz`` (imports alone took over 10 s), before and after the node operations."""
CLIENT_TIMEOUT_S = 10.0
POLL_TIMEOUT_S = 2.0
"""Per request of a poll: a node that forwards to a dead leader must not hold it up."""


class ClusterNode(Server):
    """One ``quorra serve`` of a cluster: its name, cluster port and peers' addresses."""

    start_timeout_s = CLUSTER_START_TIMEOUT_S

    def __init__(
        self,
        data_dir: Path,
        name: str,
        cluster_port: int,
        peers: dict[str, tuple[str, int]],
        secret: str,
        join: tuple[str, int] | None = None,
    ) -> None:
        super().__init__(data_dir, port=free_port())
        self.name = name
        self.cluster_port = cluster_port
        self.peers = peers
        self.secret = secret
        """``QUORRA_CLUSTER_SECRET``; a test may change it before a restart."""
        self.join = join
        """``--join`` (a test may drop it, or give peers instead, before a restart)."""

    def command(self) -> list[str]:
        if not self.peers and self.join is None:
            return super().command()
        flags = ["--node-id", self.name, "--cluster-listen", f"{HOST}:{self.cluster_port}"]
        if self.peers:
            peers = ",".join(f"{n}@{host}:{port}" for n, (host, port) in self.peers.items())
            flags += ["--peers", peers]
        if self.join is not None:
            flags += ["--join", f"{self.join[0]}:{self.join[1]}"]
        return [*super().command(), *flags]

    def start(self) -> Self:
        if self.peers or self.join is not None:
            self.env["QUORRA_CLUSTER_SECRET"] = self.secret
        else:
            self.env["QUORRA_NODE_NAME"] = self.name  # what the queues report as leader
        return super().start()


class ProxyMesh:
    """One ``FaultProxy`` per ordered pair of nodes, all on one loop; the faults of the
    module docstring."""

    def __init__(self, targets: dict[str, tuple[str, int]], handshake_frames: int) -> None:
        self.loop = ProxyLoop()
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        for a in targets:
            for b, target in targets.items():
                if a != b:
                    proxy = FaultProxy(target, self.loop, handshake_frames=handshake_frames)
                    self.proxies[a, b] = proxy.start()

    def address(self, a: str, b: str) -> tuple[str, int]:
        """Where ``a`` reaches ``b``."""
        return self.proxies[a, b].address

    def partition(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        group_b = list(group_b)
        for a in group_a:
            for b in group_b:
                self.proxies[a, b].cut()
                self.proxies[b, a].cut()

    def one_way(self, src: str, dst: str) -> None:
        self.proxies[src, dst].block("up")
        self.proxies[dst, src].block("down")

    def delay(self, ms: int) -> None:
        for proxy in self.proxies.values():
            proxy.delay_ms(ms)

    def loss(self, p: float, seed: int = 0) -> None:
        for i, proxy in enumerate(self.proxies.values()):
            proxy.drop(p, seed + i)

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        """Close every proxy and their loop; again does nothing."""
        if self.loop.loop.is_closed():
            return
        for proxy in self.proxies.values():
            proxy.close()
        self.loop.close()


class Cluster:
    """``size`` nodes named ``n1``... under ``root``; the proxies run from construction,
    the servers from ``start()``. ``stop()`` ends everything."""

    def __init__(
        self, root: Path, size: int, *, handshake_frames: int = HANDSHAKE_FRAMES_DEFAULT
    ) -> None:
        assert size >= 1
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.names = [f"n{i}" for i in range(1, size + 1)]
        cluster_ports = {name: free_port() for name in self.names}
        self.mesh = ProxyMesh({n: (HOST, p) for n, p in cluster_ports.items()}, handshake_frames)
        self.secret = secret = secrets.token_hex(16)
        self.nodes = {
            a: ClusterNode(
                root / a,
                a,
                cluster_ports[a],
                {b: self.mesh.address(a, b) for b in self.names if b != a},
                secret,
            )
            for a in self.names
        }
        self._tokens: dict[str, str] = {}
        self._clients: dict[str, httpx.Client] = {}

    # --- processes ---------------------------------------------------------------

    def start(self) -> Self:
        """Start every node at once (a node of a cluster may wait for its peers to be
        ready) and return when each answers ``/readyz``."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for started in [pool.submit(node.start) for node in self.nodes.values()]:
                started.result()
        return self

    def join(self, name: str, via: str) -> ClusterNode:
        """Start node ``name`` with ``--join`` at ``via``'s cluster port; returns once it
        answers ``/readyz``."""
        assert name not in self.nodes
        join = (HOST, self.nodes[via].cluster_port)
        node = ClusterNode(self.root / name, name, free_port(), {}, self.secret, join)
        self.nodes[name] = node
        self.names.append(name)
        return node.start()

    def kill9(self, name: str) -> None:
        self.nodes[name].kill()

    def restart(self, name: str) -> None:
        """Start a stopped or killed node again, on the same ports and data directory."""
        self.nodes[name].start()

    def stop(self) -> None:
        """Stop every node (SIGINT) and the proxies; again does nothing."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(), self.nodes.values()))
        self.mesh.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def live(self) -> list[str]:
        return [name for name, node in self.nodes.items() if node.proc is not None]

    def output(self, name: str) -> str:
        return self.nodes[name].output()

    # --- faults ------------------------------------------------------------------

    def partition(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        self.mesh.partition(group_a, group_b)

    def one_way(self, src: str, dst: str) -> None:
        self.mesh.one_way(src, dst)

    def delay(self, ms: int) -> None:
        self.mesh.delay(ms)

    def loss(self, p: float, seed: int = 0) -> None:
        self.mesh.loss(p, seed)

    def heal(self) -> None:
        self.mesh.heal()

    # --- clients -----------------------------------------------------------------

    def url(self, name: str) -> str:
        return self.nodes[name].url

    @property
    def admin_password(self) -> str:
        return ADMIN_PASSWORD

    def token(self, name: str) -> str:
        """The admin's bearer token on ``name``, made there on first use (retried while
        the node cannot answer yet: a cluster may still be electing)."""
        if name not in self._tokens:
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    self._tokens[name] = make_token(self.nodes[name], "admin", ADMIN_PASSWORD)
                    break
                except (AssertionError, httpx.TransportError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(POLL_S)
        return self._tokens[name]

    def client(self, name: str) -> httpx.Client:
        """An httpx client of ``name`` as the admin (its address survives restarts)."""
        if name not in self._clients:
            headers = {"Authorization": f"Bearer {self.token(name)}"}
            self._clients[name] = httpx.Client(
                base_url=self.url(name), headers=headers, timeout=CLIENT_TIMEOUT_S
            )
        return self._clients[name]

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(name, self.url(name), self.token(name))

    def endpoints(self) -> list[Endpoint]:
        return [self.endpoint(name) for name in self.names]

    # --- queues ------------------------------------------------------------------

    def create_queue(self, name: str, via: str = "n1", **arguments: Any) -> str:
        """Create the queue through ``via``, sending again while it answers 503 (a node
        just started may not have reached its peers yet; the create is idempotent)."""
        for _ in self._polls(f"queue {name} created"):
            response = self.client(via).put(f"/api/v1/queues/{name}", json=arguments)
            if response.status_code != 503:
                assert response.status_code in (200, 201), response.text
                return name
        raise AssertionError("_polls ends by raising")

    def raft_stats(self, queue: str, via: str) -> dict[str, Any] | None:
        """The queue's ``stats.raft`` as ``via`` answers it, or None if it cannot now."""
        try:
            response = self.client(via).get(f"/api/v1/queues/{queue}", timeout=POLL_TIMEOUT_S)
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        raft: dict[str, Any] = response.json()["stats"]["raft"]
        return raft

    def leader(self, queue: str, excluding: Iterable[str] = ()) -> str:
        """The queue's leader, as a live node reports it, once it is a live node not in
        ``excluding`` (a new leader after a crash)."""
        excluded = set(excluding)
        for _ in self._polls(f"a leader of {queue} outside {sorted(excluded)}"):
            for via in self.live():
                raft = self.raft_stats(queue, via)
                leader = raft and raft.get("leader")
                if leader in self.live() and leader not in excluded:
                    return str(leader)
        raise AssertionError("_polls ends by raising")

    def wait_caught_up(self, queue: str, name: str, lag_max: int = CAUGHT_UP_LAG_MAX) -> None:
        """Wait until the queue's leader counts ``name`` at most ``lag_max`` entries behind."""
        for _ in self._polls(f"{name} within {lag_max} entries of the leader of {queue}"):
            for via in self.live():
                raft = self.raft_stats(queue, via)
                if raft is None or raft.get("leader") not in self.live():
                    continue
                lags = [m["lag"] for m in raft.get("members", []) if m["node"] == name]
                if lags and lags[0] is not None and lags[0] <= lag_max:
                    return

    def _polls(self, what: str, timeout_s: float = WAIT_S) -> Iterator[None]:
        """Yield until ``timeout_s`` has passed, pausing between turns; then fail."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            yield
            time.sleep(POLL_S)
        raise AssertionError(f"no {what} in {timeout_s} s")
