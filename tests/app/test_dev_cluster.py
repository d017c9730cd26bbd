"""``quorra dev-cluster``: the plan of ports and directories, the command lines, the kept
secret and password; and (with the TCP transport) a real three-node run."""

from __future__ import annotations

import os
import random
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.dev_cluster import _kept, command, environment, plan
from app.ports import ephemeral_low
from tests.app.conftest import QUORRA, ROOT


def test_nodes_get_consecutive_ports_and_their_own_directories(tmp_path: Path) -> None:
    nodes = plan(3, tmp_path, 8001, 7001)
    assert [(n.name, n.http_port, n.cluster_port) for n in nodes] == [
        ("n1", 8001, 7001),
        ("n2", 8002, 7002),
        ("n3", 8003, 7003),
    ]
    assert [n.data_dir for n in nodes] == [tmp_path / "n1", tmp_path / "n2", tmp_path / "n3"]
    with pytest.raises(ValueError):
        plan(0, tmp_path, 8001, 7001)


def test_each_node_lists_the_others_as_peers(tmp_path: Path) -> None:
    nodes = plan(3, tmp_path, 8001, 7001)
    cmd = command(nodes[1], nodes)
    assert cmd[cmd.index("--node-id") + 1] == "n2"
    assert cmd[cmd.index("--cluster-listen") + 1] == "127.0.0.1:7002"
    assert cmd[cmd.index("--peers") + 1] == "n1@127.0.0.1:7001,n3@127.0.0.1:7003"
    alone = plan(1, tmp_path, 8001, 7001)
    assert "--peers" not in command(alone[0], alone)


def test_the_secret_and_password_are_made_once_private_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _kept(tmp_path / "cluster.secret", "s" * 40)
    assert _kept(tmp_path / "cluster.secret", "other") == first == "s" * 40
    assert stat.S_IMODE((tmp_path / "cluster.secret").stat().st_mode) == 0o600
    monkeypatch.setenv("QUORRA_CLUSTER_SECRET", "from-the-shell")
    env = environment(tmp_path, "pw")
    assert "QUORRA_CLUSTER_SECRET" not in env, "a stray secret would be refused as two secrets"
    assert env["QUORRA_CLUSTER_SECRET_FILE"] == str(tmp_path / "cluster.secret")
    assert env["QUORRA_ADMIN_PASSWORD"] == "pw"


def consecutive_free_ports(count: int = 3) -> int:
    """The first of ``count`` consecutive ports free now, below the kernel's ephemeral range:
    a port next to one the kernel handed out may become the source port of the nodes' own
    connections to each other before the node that should listen on it starts."""
    low = ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(10_000, low - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError("no run of free ports below the ephemeral range")


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.integration
def test_three_local_nodes_form_a_cluster_and_stop_together(tmp_path: Path) -> None:
    """``quorra dev-cluster 3``: every node ready and connected to the others, a queue
    replicated on all three served through any node, and Ctrl-C stops every node."""
    port, cluster_port = consecutive_free_ports(), consecutive_free_ports()
    while abs(cluster_port - port) < 3:
        cluster_port = consecutive_free_ports()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORRA_")}
    root = tmp_path / "dc"
    proc = subprocess.Popen(
        [
            QUORRA,
            "dev-cluster",
            "3",
            "--data-dir",
            str(root),
            "--port",
            str(port),
            "--cluster-port",
            str(cluster_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
        # Ctrl-C as at a terminal, even when the suite runs where SIGINT is ignored (a
        # background job of a shell without job control): the child inherits that.
        preexec_fn=_interruptible,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().decode() for _ in range(5)]
        assert lines[0].startswith("n1  dashboard http://127.0.0.1:"), lines
        password = (root / "admin.password").read_text().strip()
        assert f"password: {password}" in lines[3]
        urls = [f"http://127.0.0.1:{port + k}" for k in range(3)]
        # Tokens are the cluster metadata's: one made on n1 works on every node.
        made = httpx.post(f"{urls[0]}/api/v1/tokens", auth=("admin", password))
        assert made.status_code == 201, made.text
        bearer = [{"Authorization": f"Bearer {made.json()['token']}"}] * 3
        created = httpx.put(f"{urls[0]}/api/v1/queues/dc", json={"replicas": 3}, headers=bearer[0])
        assert created.status_code == 201, created.text
        deadline = time.monotonic() + 30
        while True:
            published = httpx.post(
                f"{urls[2]}/api/v1/queues/dc/messages",
                json={"messages": [{"body": "x"}]},
                headers=bearer[2],
            )
            if published.status_code == 201 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert published.status_code == 201, published.text
        nodes = httpx.get(f"{urls[1]}/api/v1/cluster", headers=bearer[1]).json()["nodes"]
        assert sorted(n["name"] for n in nodes) == ["n1", "n2", "n3"]
        assert all(n["connected"] for n in nodes if not n["self"]), nodes
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            # A stop that timed out fails the test; its nodes and pipe do not outlive it.
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert proc.returncode == 0
    for k in range(3):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port + k}/healthz", timeout=1)
