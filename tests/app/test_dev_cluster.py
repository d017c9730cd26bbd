"""``quorra dev-cluster``: the plan of ports and directories, the command lines, the kept
secret and password; and (with the TCP transport) a real three-node run."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from app.dev_cluster import _kept, command, environment, plan


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
