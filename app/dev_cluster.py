"""``quorra dev-cluster N``: N local nodes of one cluster on 127.0.0.1, for trying it out.

Rule: everything lives under one directory (``./data/dev-cluster`` by default): a data
directory per node (``n1``, ``n2``, ...), each node's log (``n1.log``), the cluster secret
(``cluster.secret``, mode 0600) and the admin password (``admin.password``), made on the
first run and reused after, so the cluster can be stopped and started again on its data.
Node ``nK`` serves HTTP on ``port + K - 1`` and talks to its peers on ``cluster_port + K -
1``. Every node bootstraps the same ``admin`` user from ``QUORRA_ADMIN_PASSWORD``.

It prints each node's URL and the login once every node is ready, and stops them all
(SIGINT, then SIGKILL after a grace period) on Ctrl-C, or as soon as one of them exits.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class DevNode:
    name: str
    http_port: int
    cluster_port: int
    data_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


def plan(count: int, root: Path, port: int, cluster_port: int) -> list[DevNode]:
    """The nodes of a dev cluster of ``count`` nodes (1 to 9)."""
    if not 1 <= count <= 9:
        raise ValueError("a dev cluster has 1 to 9 nodes")
    return [
        DevNode(f"n{k}", port + k - 1, cluster_port + k - 1, root / f"n{k}")
        for k in range(1, count + 1)
    ]


def _kept(path: Path, make: str) -> str:
    """The value in ``path``, written (0600) with ``make`` on the first run."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make + "\n")
    return path.read_text().strip()


def command(node: DevNode, nodes: list[DevNode]) -> list[str]:
    """The ``quorra serve`` command line of ``node``."""
    quorra = str(Path(sys.executable).with_name("quorra"))
    cmd = [quorra, "serve", "--data-dir", str(node.data_dir), "--host", "127.0.0.1",
           "--port", str(node.http_port), "--node-id", node.name]  # fmt: skip
    peers = [f"{n.name}@127.0.0.1:{n.cluster_port}" for n in nodes if n is not node]
    if peers:
        cmd += ["--cluster-listen", f"127.0.0.1:{node.cluster_port}", "--peers", ",".join(peers)]
    return cmd


def environment(root: Path, password: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
    env["QUORRA_CLUSTER_SECRET_FILE"] = str(root / "cluster.secret")
    env["QUORRA_ADMIN_PASSWORD"] = password
    return env


def _ready(node: DevNode) -> bool:
    try:
        return httpx.get(f"{node.url}/readyz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs.values():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exited(procs: dict[str, subprocess.Popen[bytes]]) -> str | None:
    return next((name for name, p in procs.items() if p.poll() is not None), None)


def run(count: int, root: Path, port: int, cluster_port: int) -> int:
    """Start the cluster, wait until every node is ready, print how to reach it, and
    stop it on Ctrl-C or when a node exits. Returns the exit status."""
    nodes = plan(count, root, port, cluster_port)
    secret = _kept(root / "cluster.secret", secrets.token_urlsafe(32))
    assert secret
    password = _kept(root / "admin.password", secrets.token_urlsafe(12))
    env = environment(root, password)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for node in nodes:
            with (root / f"{node.name}.log").open("ab") as log:
                procs[node.name] = subprocess.Popen(
                    command(node, nodes), stdout=log, stderr=subprocess.STDOUT, env=env
                )
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = list(nodes)
        while waiting:
            gone = _exited(procs)
            if gone is not None or time.monotonic() > deadline:
                why = f"{gone} exited" if gone else f"not ready in {READY_TIMEOUT_S:.0f} s"
                print(f"quorra dev-cluster: {why}; see {root}/{gone or 'n1'}.log", file=sys.stderr)
                return 1
            waiting = [n for n in waiting if not _ready(n)]
            if waiting:
                time.sleep(POLL_S)
        for node in nodes:
            print(
                f"{node.name}  dashboard {node.url}/  API {node.url}/api/v1  (cluster port {node.cluster_port})"
            )
        print(f"Log in as 'admin' with password: {password}  (kept in {root}/admin.password)")
        print(f"Logs: {root}/n*.log. Ctrl-C stops every node.")
        while (gone := _exited(procs)) is None:
            time.sleep(POLL_S)
        print(f"quorra dev-cluster: {gone} exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(procs)


__all__ = ["DevNode", "command", "environment", "plan", "run"]
